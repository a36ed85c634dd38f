"""``patchkit doctor --record FILE``: what the doctor verified, as compat-matrix records.

The file is a matrix document (schema 1) with no environments and one record per verified patch,
``verified_by: [doctor:<host>]``, with the installed versions and target fingerprints, exactly as
``patchkit matrix record`` measures them. ``patchkit matrix merge FILE`` folds it into
``compat_matrix.yaml``: a user's stack becomes evidence the project can review and keep.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path
from typing import Iterable, Mapping

from ..matrix.model import VersionRecord
from ..matrix.record import measure, merge
from ..matrix.writer import replace_patches
from ..runtime.errors import ConfigError
from .runner import VERIFIED, Verdict

#: What a matrix file needs besides its generated records.
HEADER = "# Written by `patchkit doctor --record`; fold into compat_matrix.yaml with `patchkit matrix merge`.\n" \
         "schema: 1\nenvironments: {}\n\n"


def source_label(host: str | None = None) -> str:
    """``doctor:<host>``: a verified_by source naming where the doctor ran."""
    name = "".join(c if c.isalnum() or c in "._-" else "-" for c in (host or socket.gethostname()).lower())
    return f"doctor:{name.strip('-.') or 'host'}"


def records(verdicts: Iterable[Verdict], label: str) -> dict[str, dict[str, tuple[VersionRecord, ...]]]:
    """The matrix records of the verified patches."""
    import patchkit

    found: Mapping[str, Mapping[str, tuple[VersionRecord, ...]]] = {}
    for verdict in verdicts:
        if verdict.verdict != VERIFIED:
            continue
        measured = measure(patchkit.engine().patch(verdict.id), "doctor")
        if measured is None:
            continue
        variant, record = measured
        found = merge(found, verdict.id, variant, dataclasses.replace(record, verified_by=(label,)))
    return {pid: dict(variants) for pid, variants in found.items()}


def check_writable(path: str | Path) -> None:
    """Refuse a ``--record`` path that cannot be written, before any check runs (ConfigError)."""
    target = Path(path)
    if target.is_dir():
        raise _unwritable(path, "it is a directory")
    folder = target.parent
    if not folder.is_dir():
        raise _unwritable(path, f"its folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise _unwritable(path, "permission denied")


def write_records(path: str | Path, verdicts: Iterable[Verdict], label: str | None = None) -> int:
    """Write the records file; returns how many records it holds. ConfigError if it cannot be written."""
    found = records(verdicts, label or source_label())
    try:
        Path(path).write_text(replace_patches(HEADER, found), encoding="utf-8")
    except OSError as exc:
        raise _unwritable(path, exc.strerror or repr(exc)) from exc
    return sum(len(r) for variants in found.values() for r in variants.values())


def _unwritable(path: str | Path, why: str) -> ConfigError:
    return ConfigError("--record", str(path), "a file path that can be written", problem=f"not writable ({why})")
