"""The generated tables of the documentation: the supported-versions table (one row per variant) and
the README's catalogue table (one row per patch), from the matrix and the registry.

Only the text between a table's markers (``<!-- compat-table:start -->`` ... ``:end -->``,
``<!-- catalogue-table:start -->`` ... ``:end -->``) is rewritten; the rest of the document is not
patchkit's to touch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping

from ..runtime import pep440
from ..runtime.catalogue import Registered
from .model import IN_RANGE, KNOWN_BAD, NATIVE, UNSUPPORTED, VERIFIED, Matrix, VersionRecord
from .writer import record_order

START = "<!-- compat-table:start -->"
END = "<!-- compat-table:end -->"
CATALOGUE_START = "<!-- catalogue-table:start -->"
CATALOGUE_END = "<!-- catalogue-table:end -->"
#: The longest "what it fixes" cell: the summary's first sentence, cut at a word.
SUMMARY_WIDTH = 110


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


def has_markers(text: str, start: str, end: str) -> bool:
    return 0 <= text.find(start) < text.find(end)


def replace_between(text: str, start_marker: str, end_marker: str, body: str, name: str) -> str:
    """``text`` with what lies between the two markers replaced by ``body``; ValueError without them."""
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise ValueError(f"{name} has no {start_marker} ... {end_marker} markers; add them where the table belongs")
    return text[:start + len(start_marker)] + "\n" + body + "\n" + text[end:]


def update(readme: str, matrix: Matrix, name: str = "README.md",
           ranges: Mapping[tuple[str, str], str] | None = None) -> str:
    """``readme`` with the table between the markers regenerated."""
    return replace_between(readme, START, END, render(matrix, ranges), name)


def _one_line(summary: str) -> str:
    """The summary's first sentence, at most SUMMARY_WIDTH characters (cut at a word), with the
    characters Markdown would read as table cells or emphasis (``|``, ``*``) escaped."""
    first = summary.split(". ")[0].rstrip(".")
    if len(first) > SUMMARY_WIDTH:
        first = first[:SUMMARY_WIDTH].rsplit(" ", 1)[0].rstrip(",;:(") + " …"
    return first.replace("|", "\\|").replace("*", "\\*")


def _span(versions: Iterable[str]) -> str:
    ordered = sorted(set(versions), key=lambda v: pep440.parse(v).key())
    if not ordered:
        return ""
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]} – {ordered[-1]}"


def render_catalogue(matrix: Matrix, patches: Iterable[Registered]) -> str:
    """The README's catalogue: per patch its upstream, the releases it was checked on (verified or
    native there), whether it is on by default, and one line of what it does."""
    lines = [
        "<!-- generated from the registry and compat_matrix.yaml by `patchkit matrix table`; do not edit by hand -->",
        "| patch | upstream | checked on | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for registered in sorted(patches, key=lambda r: r.patch.id):
        patch = registered.patch
        upstream = patch.distributions[0] if patch.distributions else "—"
        records = [r for variant in matrix.patches.get(patch.id, {}).values() for r in variant]
        checked = _span(r.versions[upstream] for r in records if r.status in IN_RANGE and upstream in r.versions)
        native = all(v.native for v in patch.variants)
        default = "native" if native else "opt-in" if patch.opt_in else "on"
        lines.append(f"| `{patch.id}` | {upstream} | {checked or 'not yet'} | {default} | {_one_line(patch.summary)} |")
    return "\n".join(lines)


def update_catalogue(readme: str, matrix: Matrix, patches: Iterable[Registered], name: str = "README.md") -> str:
    """``readme`` with the catalogue table between its markers regenerated."""
    return replace_between(readme, CATALOGUE_START, CATALOGUE_END, render_catalogue(matrix, patches), name)
