"""The README's supported-versions table, generated from the matrix.

Only the text between ``<!-- compat-table:start -->`` and ``<!-- compat-table:end -->`` is
rewritten; the rest of the README is not patchkit's to touch.
"""

from __future__ import annotations

from collections import defaultdict

from .model import KNOWN_BAD, NATIVE, UNSUPPORTED, VERIFIED, Matrix, VersionRecord
from .writer import record_order

START = "<!-- compat-table:start -->"
END = "<!-- compat-table:end -->"


class StaleTable(Exception):
    """The README's table differs from what the matrix generates."""


def _versions(records: list[VersionRecord]) -> str:
    if not records:
        return ""
    dists = sorted({d for r in records for d in r.versions})
    if len(dists) == 1:
        (dist,) = dists
        shown = []
        for r in sorted(records, key=record_order):
            mark = "" if any(s.startswith("tests:") for s in r.verified_by) or not r.verified_by else " (static)"
            shown.append(f"{r.versions[dist]}{mark}")
        return f"{dist} {', '.join(shown)}"
    combinations = (" + ".join(f"{d} {v}" for d, v in sorted(r.versions.items()))
                    for r in sorted(records, key=record_order))
    return "; ".join(combinations)


def render(matrix: Matrix) -> str:
    """The Markdown table, one row per variant."""
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
            lines.append(f"| `{patch_id}` | `{variant}` | {_versions(by_status[VERIFIED]) or '—'} | "
                         f"{_versions(by_status[NATIVE]) or '—'} | "
                         f"{_versions(by_status[KNOWN_BAD] + by_status[UNSUPPORTED]) or '—'} |")
    if len(lines) == 3:
        lines.append("| — | — | nothing recorded yet | — | — |")
    lines.append("")
    lines.append("Versions marked (static) were checked from release artifacts (`patchkit matrix static`); "
                 "the others ran the patch's tests.")
    return "\n".join(lines)


def update(readme: str, matrix: Matrix, name: str = "README.md") -> str:
    """``readme`` with the table between the markers regenerated."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{name} has no {START} ... {END} markers; add them where the table belongs")
    return readme[:start + len(START)] + "\n" + render(matrix) + "\n" + readme[end:]
