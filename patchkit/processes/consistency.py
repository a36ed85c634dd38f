"""Comparing the manifests of many processes: do all processes of a job have the same patches?

Manifests come from ``torch.distributed`` (:func:`check_distributed`, an all-gather over the
process group), from files (:func:`check_files`), or from anywhere as :class:`Manifest` objects
(:func:`check`, e.g. returned by Ray actors). For each patch, the value most processes hold is the
reference (ties go to the lowest-numbered process, so rank 0 in a two-rank job); every process
holding something else is named, with each field that differs.

``python -m patchkit.processes.consistency DIR_OR_FILES...`` checks manifest files. Exit status: 0 the
processes agree, 1 they differ, 2 the input cannot be compared (a manifest file that is not a
readable manifest, named on stderr; no manifest files; bad arguments).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import socket
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..runtime import settings
from ..runtime.errors import ConfigError, PatchkitError
from .manifest import COMPARED_FIELDS, Manifest, ManifestError, collect

logger = logging.getLogger(__name__)

#: A process whose manifest lacks a patch the others have.
ABSENT = "absent"

#: Exit statuses of ``python -m patchkit.processes.consistency``.
EXIT_SAME, EXIT_DIFFERENT, EXIT_UNREADABLE = 0, 1, 2


@dataclass(frozen=True)
class Difference:
    """One field of one patch in which one process differs from the reference."""

    process: str  #: the process's label: "rank 3", or "host:pid"
    index: int  #: its position among the compared manifests
    patch_id: str
    field: str  #: one of COMPARED_FIELDS, or "presence"
    expected: Any
    found: Any
    detail: str = ""  #: the differing process's own account of this patch (its status detail/error)

    def describe(self) -> str:
        text = f"{self.field} {self.found!r}, the others {self.expected!r}"
        return text + (f" ({self.detail})" if self.detail else "")


@dataclass(frozen=True)
class Report:
    """The outcome of comparing manifests: every difference, grouped for people by process."""

    processes: tuple[str, ...]
    differences: tuple[Difference, ...]

    @property
    def ok(self) -> bool:
        return not self.differences

    def differing_processes(self) -> list[str]:
        return list(dict.fromkeys(d.process for d in self.differences))

    def differing_patches(self) -> list[str]:
        return sorted({d.patch_id for d in self.differences})

    def render(self) -> str:
        if self.ok:
            return f"patchkit: the {len(self.processes)} processes have the same patches"
        lines = [f"patchkit: patch mismatch: {len(self.differing_processes())} of {len(self.processes)} processes "
                 f"differ from the others in {', '.join(self.differing_patches())}"]
        grouped: dict[tuple[str, str], list[Difference]] = {}
        for difference in self.differences:
            grouped.setdefault((difference.process, difference.patch_id), []).append(difference)
        for (process, patch_id), differences in grouped.items():
            lines.append(f"  {process}: {patch_id}: " + "; ".join(d.describe() for d in differences))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "processes": list(self.processes),
            "differing_processes": self.differing_processes(),
            "differences": [
                {"process": d.process, "index": d.index, "patch": d.patch_id, "field": d.field,
                 "expected": d.expected, "found": d.found, "detail": d.detail}
                for d in self.differences
            ],
            "text": self.render(),
        }


class ManifestMismatchError(PatchkitError, RuntimeError):
    """Strict mode: the processes of a job do not have the same patches."""

    def __init__(self, report: Report) -> None:
        self.report = report
        super().__init__(report.render())


def compare(manifests: Sequence[Manifest], *, exact: bool = False) -> Report:
    """Compare manifests patch by patch against the value most of them hold.

    A process that has not imported an upstream yet holds its patches ``pending``: they install at
    that import. By default that agrees with ``applied``; ``exact=True`` compares states as they are.
    A patch still ``pending`` although its module *was* imported in that process never agrees: it
    will not install by itself, and is named as such.
    """
    labels = tuple(_labels(manifests))
    tables = [manifest.by_id() for manifest in manifests]
    patch_ids = sorted({patch_id for table in tables for patch_id in table})
    differences = []
    for patch_id in patch_ids:
        values = [_value(table.get(patch_id), exact) for table in tables]
        reference = _reference(values)
        for index, value in enumerate(values):
            if value == reference:
                continue
            entry = tables[index].get(patch_id)
            detail = (entry.error or entry.detail) if entry is not None else ""
            if entry is not None and entry.imported_while_pending:
                detail = (f"pending although {', '.join(entry.imported_while_pending)} is imported in this "
                          f"process: it will not install by itself")
            if value is None or reference is None:
                differences.append(Difference(labels[index], index, patch_id, "presence",
                                              ABSENT if reference is None else "registered",
                                              ABSENT if value is None else "registered", detail))
                continue
            for name in COMPARED_FIELDS:
                if value[name] != reference[name]:
                    differences.append(Difference(labels[index], index, patch_id, name, reference[name],
                                                  value[name], detail))
    return Report(labels, tuple(differences))


def _labels(manifests: Sequence[Manifest]) -> Iterable[str]:
    seen: Counter[str] = Counter()
    for index, manifest in enumerate(manifests):
        label = manifest.label()
        seen[label] += 1
        yield label if seen[label] == 1 else f"{label} (#{index})"


def _value(entry: Any, exact: bool) -> dict[str, Any] | None:
    if entry is None:
        return None
    value: dict[str, Any] = entry.compared()
    if not exact and value["state"] == "pending" and not entry.imported_while_pending:
        value["state"] = "applied"
    return value


def _reference(values: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    keys = [json.dumps(value, sort_keys=True) for value in values]
    counts = Counter(keys)
    best = max(counts.values())
    return values[next(i for i, key in enumerate(keys) if counts[key] == best)]


def check(manifests: Sequence[Manifest], *, strict: bool | None = None, exact: bool = False,
          report_path: str | os.PathLike[str] | None = None, publish: bool = True) -> Report:
    """Compare, log the report (and write it to ``report_path`` as JSON) if ``publish``, and in strict
    mode (argument, else ``PATCHKIT_STRICT``) raise ``ManifestMismatchError`` on any difference."""
    report = compare(manifests, exact=exact)
    if publish:
        _publish(report, report_path)
    if not report.ok and _strict(strict):
        raise ManifestMismatchError(report)
    return report


def check_files(paths: Iterable[str | os.PathLike[str]], **options: Any) -> Report:
    """:func:`check` the manifests in these JSON files; a folder stands for every ``*.json`` in it,
    except the one this process itself wrote there under ``PATCHKIT_MANIFEST_DIR``."""
    own = f"{socket.gethostname()}-{os.getpid()}.json"
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(p for p in path.glob("*.json") if p.name != own) if path.is_dir() else [path])
    if not files:
        raise FileNotFoundError(f"no manifest files in {[str(p) for p in map(Path, paths)]}")
    return check([Manifest.read(file) for file in files], **options)


def check_distributed(*, group: Any = None, strict: bool | None = None, exact: bool = False,
                      report_path: str | os.PathLike[str] | None = None,
                      manifest: Manifest | None = None) -> Report:
    """All-gather every rank's manifest over ``group`` (default: the world) and compare them.

    A collective: every rank of the group must call it. Every rank gets the same report; rank 0 of
    the group alone logs it and writes ``report_path``. In strict mode every rank raises, so no rank
    is left waiting in a later collective.
    """
    # Imported only here: importing patchkit must not import torch.
    dist = importlib.import_module("torch.distributed")

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("check_distributed needs an initialised torch.distributed process group; "
                           "without one, gather manifests yourself and call patchkit.processes.consistency.check")
    mine = manifest if manifest is not None else collect(rank=dist.get_rank())
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine.to_dict(), group=group)
    is_first = dist.get_rank(group) == 0
    return check([Manifest.from_dict(data) for data in gathered], strict=strict, exact=exact,
                 report_path=report_path if is_first else None, publish=is_first)


def _publish(report: Report, report_path: str | os.PathLike[str] | None) -> None:
    if report.ok:
        logger.info("%s", report.render())
    else:
        logger.warning("%s", report.render())
    if report_path is not None:
        target = Path(report_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(report.to_dict(), indent=2))


def _strict(explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    try:
        return settings.parse_bool(settings.STRICT, os.environ.get(settings.STRICT, ""))
    except ConfigError:
        logger.warning("patchkit: %s is malformed; the consistency check is not strict", settings.STRICT)
        return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m patchkit.processes.consistency",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="manifest JSON files, or folders of them")
    parser.add_argument("--exact", action="store_true", help="'pending' differs from 'applied'")
    parser.add_argument("--report", help="also write the report here as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        report = check_files(args.paths, strict=False, exact=args.exact, report_path=args.report)
    except (ManifestError, FileNotFoundError) as exc:
        logger.error("patchkit: cannot compare: %s", exc)
        return EXIT_UNREADABLE
    return EXIT_SAME if report.ok else EXIT_DIFFERENT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
