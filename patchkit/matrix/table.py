"""The README's supported-versions table, generated from the matrix.

Only the text between ``<!-- compat-table:start -->`` and ``<!-- compat-table:end -->`` is
rewritten; the rest of the README is not patchkit's to touch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

from ..runtime.catalogue import Registered
from .model import KNOWN_BAD, NATIVE, UNSUPPORTED, VERIFIED, Matrix, VersionRecord
from .writer import record_order

START = "<!-- compat-table:start -->"
END = "<!-- compat-table:end -->"


def _shown(record: VersionRecord) -> str:
    return " + ".join(f"{d} {v}" for d, v in sorted(record.versions.items()))


def _versions(records: list[VersionRecord]) -> str:
    """``dist 1.0, 1.1; static only: 1.2``: versions whose tests ran first, then those only checked
    from release artifacts."""
    ordered = sorted(records, key=record_order)
    tested = [r for r in ordered if not r.verified_by or any(s.startswith("tests:") for s in r.verified_by)]
    static = [r for r in ordered if r not in tested]
    dists = sorted({d for r in records for d in r.versions})
    if len(dists) == 1:
        (dist,) = dists
        if not tested:
            return f"{dist} {', '.join(r.versions[dist] for r in static)} (static only)" if static else ""
        shown = f"{dist} {', '.join(r.versions[dist] for r in tested)}"
        return shown + (f"; static only: {', '.join(r.versions[dist] for r in static)}" if static else "")
    shown = "; ".join(_shown(r) for r in tested)
    if static:
        shown += ("; " if shown else "") + "static only: " + "; ".join(_shown(r) for r in static)
    return shown


def render(matrix: Matrix, ranges: Mapping[tuple[str, str], str] | None = None) -> str:
    """The Markdown table, one row per variant. ``ranges`` (patch id, variant name) -> declared range,
    from the registry, shown beside a labelled variant's name."""
    lines = [
        "<!-- generated from compat_matrix.yaml by `patchkit matrix table`; do not edit by hand -->",
        "| patch | variant | verified on | native on | known bad |",
        "|---|---|---|---|---|",
    ]
    for patch_id in sorted(matrix.patches):
        for variant in sorted(matrix.patches[patch_id]):
            by_status: dict[str, list[VersionRecord]] = defaultdict(list)
            for record in matrix.patches[patch_id][variant]:
                by_status[record.status].append(record)
            declared = (ranges or {}).get((patch_id, variant))
            name = f"`{variant}`" + (f" ({declared})" if declared and declared != variant else "")
            lines.append(f"| `{patch_id}` | {name} | {_versions(by_status[VERIFIED]) or '—'} | "
                         f"{_versions(by_status[NATIVE]) or '—'} | "
                         f"{_versions(by_status[KNOWN_BAD] + by_status[UNSUPPORTED]) or '—'} |")
    if len(lines) == 3:
        lines.append("| — | — | nothing recorded yet | — | — |")
    lines.append("")
    lines.append("\"static only\": checked from the release artifacts (`patchkit matrix static`: targets present, "
                 "signatures and fingerprints as recorded); the other versions ran the patch's tests.")
    return "\n".join(lines)


def ranges_of(patches: Iterable[Registered]) -> dict[tuple[str, str], str]:
    """Each registered variant's declared range, as shown in the table."""
    return {(r.patch.id, v.name): ", ".join(f"{d}{spec}" for d, spec in v.requires.items())
            for r in patches for v in r.patch.variants}


def update(readme: str, matrix: Matrix, name: str = "README.md",
           ranges: Mapping[tuple[str, str], str] | None = None) -> str:
    """``readme`` with the table between the markers regenerated."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{name} has no {START} ... {END} markers; add them where the table belongs")
    return readme[:start + len(START)] + "\n" + render(matrix, ranges) + "\n" + readme[end:]
