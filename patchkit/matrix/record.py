"""``patchkit matrix record``: what this environment verified, written back into the matrix.

Run after an environment's tests passed, in that environment: for every registered patch, the
variant the installed upstreams select, their versions, and the fingerprint and signature of each
``Replace``/``Wrap`` target as installed. A record with the same versions is replaced (its
``verified_by`` sources are kept and this environment added); other records stay.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from pathlib import Path
from typing import Mapping, Sequence

from ..runtime.catalogue import Registered
from ..runtime.declaration import Patch, Replace, Target, Wrap
from ..runtime.fingerprint import module_file
from ..runtime.versions import Availability, InstalledVersion, Outcome, installed_version, select_variant
from .model import NATIVE, VERIFIED, Matrix, TargetRecord, VersionRecord
from .symbols import ABSENT, inspect_target

logger = logging.getLogger(__name__)


def _installed(patch: Patch) -> dict[str, InstalledVersion]:
    found = {}
    for dist in patch.distributions:
        module = patch.version_modules.get(dist)
        version = installed_version(dist, module)
        if version.availability is Availability.DEFERRED and module is not None:
            # A source checkout without metadata: its version is known once imported; recording may import.
            importlib.import_module(module)
            version = installed_version(dist, module)
        found[dist] = version
    return found


def _installed_file(module: str) -> Path | None:
    path = module_file(module)
    return None if path is None else Path(path)


def measure(patch: Patch, environment: str) -> tuple[str, VersionRecord] | None:
    """The record this environment gives ``patch``: (variant name, record), or None if none applies."""
    found = _installed(patch)
    selection = select_variant(patch, found)
    if selection.outcome is not Outcome.SELECTED or selection.variant is None:
        logger.info("patchkit: %s: nothing to record here (%s)", patch.id, selection.outcome.value)
        return None
    variant = selection.variant
    targets: dict[str, TargetRecord] = {}
    for action in variant.installs:
        if not isinstance(action, (Replace, Wrap)):
            continue
        facts = inspect_target(_installed_file, Target.parse(action.target))
        if facts.status == ABSENT:
            logger.warning("patchkit: %s: %s has no readable source here; not fingerprinted", patch.id, action.target)
            continue
        targets[action.target] = TargetRecord(facts.fingerprint, facts.signature)
    versions = {dist: str(found[dist].raw) for dist in variant.requires}
    status = NATIVE if variant.native is not None else VERIFIED
    return variant.name, VersionRecord(versions, status, (f"tests:{environment}",), targets)


def merge(patches: Mapping[str, Mapping[str, tuple[VersionRecord, ...]]], patch_id: str, variant: str,
          new: VersionRecord) -> dict[str, dict[str, tuple[VersionRecord, ...]]]:
    """``patches`` with ``new`` in place of the record of the same versions (if any)."""
    merged = {pid: dict(variants) for pid, variants in patches.items()}
    records = list(merged.setdefault(patch_id, {}).get(variant, ()))
    for i, old in enumerate(records):
        if old.key() == new.key():
            sources = tuple(sorted(set(old.verified_by) | set(new.verified_by)))
            records[i] = dataclasses.replace(new, verified_by=sources, note=old.note)
            break
    else:
        records.append(new)
    merged[patch_id][variant] = tuple(records)
    return merged


def record(matrix: Matrix, patches: Sequence[Registered], environment: str) -> Matrix:
    """``matrix`` with this environment's records merged in."""
    if environment not in matrix.environments:
        from ..runtime.errors import ConfigError

        raise ConfigError("--env", environment, f"an environment of {matrix.path}: {', '.join(matrix.environments)}",
                          problem="not an environment in the matrix")
    updated: Mapping[str, Mapping[str, tuple[VersionRecord, ...]]] = matrix.patches
    for registered in patches:
        measured = measure(registered.patch, environment)
        if measured is not None:
            updated = merge(updated, registered.patch.id, *measured)
    return dataclasses.replace(matrix, patches=updated)
