"""``patchkit matrix merge FILE``: fold another matrix document's records (a doctor run's) into this one.

A contributed record with the same versions as one already there replaces it, keeping the union of
both ``verified_by`` sources and the existing note (see :func:`.record.merge`); new records are added.
Environments are never taken from a contribution.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from .model import Matrix, VersionRecord
from .record import merge


def merge_contribution(matrix: Matrix, contribution: Matrix) -> Matrix:
    """``matrix`` with every record of ``contribution`` merged in."""
    updated: Mapping[str, Mapping[str, tuple[VersionRecord, ...]]] = matrix.patches
    for patch_id, variants in contribution.patches.items():
        for variant, records in variants.items():
            for record in records:
                updated = merge(updated, patch_id, variant, dataclasses.replace(record, position=None))
    return dataclasses.replace(matrix, patches=updated)
