"""The generated tables of the documentation, from the matrix and the registry: the supported-versions
table (one row per variant), the catalogue table (one row per patch, docs/catalogue.md) and the
catalogue's summary (one row per upstream, the README's: it stays the same size as the catalogue grows).

Only the text between a table's markers (``<!-- compat-table:start -->`` ... ``:end -->``,
``<!-- catalogue-table:start -->`` ... ``:end -->``, ``<!-- catalogue-summary:start -->`` ...
``:end -->``) is rewritten; the rest of the document is not patchkit's to touch.
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
SUMMARY_START = "<!-- catalogue-summary:start -->"
SUMMARY_END = "<!-- catalogue-summary:end -->"
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


def _checked_on(matrix: Matrix, patch_id: str, upstream: str) -> list[str]:
    """The releases of ``upstream`` where the patch, or upstream natively, was verified."""
    records = [r for variant in matrix.patches.get(patch_id, {}).values() for r in variant]
    return [r.versions[upstream] for r in records if r.status in IN_RANGE and upstream in r.versions]


def _default(registered: Registered) -> str:
    patch = registered.patch
    return "native" if all(v.native for v in patch.variants) else "opt-in" if patch.opt_in else "on"


def render_catalogue(matrix: Matrix, patches: Iterable[Registered]) -> str:
    """The catalogue: per patch its upstream, the releases it was checked on (verified or
    native there), whether it is on by default, and one line of what it does."""
    lines = [
        "<!-- generated from the registry and compat_matrix.yaml by `patchkit matrix table`; do not edit by hand -->",
        "| patch | upstream | checked on | default | what it does |",
        "|---|---|---|---|---|",
    ]
    for registered in sorted(patches, key=lambda r: r.patch.id):
        patch = registered.patch
        upstream = patch.distributions[0] if patch.distributions else "—"
        checked = _span(_checked_on(matrix, patch.id, upstream))
        lines.append(f"| `{patch.id}` | {upstream} | {checked or 'not yet'} | {_default(registered)} | "
                     f"{_one_line(patch.summary)} |")
    return "\n".join(lines)


def render_summary(matrix: Matrix, patches: Iterable[Registered]) -> str:
    """The catalogue in one row per upstream: how many patches, how many of them are on by default,
    opt-in or native (declared, with a test of upstream doing the job), and the releases checked."""
    by_upstream: dict[str, list[Registered]] = defaultdict(list)
    for registered in patches:
        distributions = registered.patch.distributions
        by_upstream[distributions[0] if distributions else "—"].append(registered)
    lines = [
        "<!-- generated from the registry and compat_matrix.yaml by `patchkit matrix table`; do not edit by hand -->",
        "| upstream | patches | on by default | opt-in | native | checked on |",
        "|---|---|---|---|---|---|",
    ]
    for upstream in sorted(by_upstream):
        members = by_upstream[upstream]
        defaults = [_default(r) for r in members]
        checked = _span(v for r in members for v in _checked_on(matrix, r.patch.id, upstream))
        lines.append(f"| {upstream} | {len(members)} | {defaults.count('on')} | {defaults.count('opt-in')} | "
                     f"{defaults.count('native')} | {checked or 'not yet'} |")
    return "\n".join(lines)


def update_summary(readme: str, matrix: Matrix, patches: Iterable[Registered], name: str = "README.md") -> str:
    """``readme`` with the catalogue's summary between its markers regenerated."""
    return replace_between(readme, SUMMARY_START, SUMMARY_END, render_summary(matrix, patches), name)


def update_catalogue(readme: str, matrix: Matrix, patches: Iterable[Registered], name: str = "README.md") -> str:
    """``readme`` with the catalogue table between its markers regenerated."""
    return replace_between(readme, CATALOGUE_START, CATALOGUE_END, render_catalogue(matrix, patches), name)
