"""The compatibility grid: every patch down, every recorded upstream release across, one verdict a cell.

Generated from the matrix and the registry (``patchkit matrix grid``), as a Markdown page and as a
standalone HTML page. A cell reads, for the patch's own upstream at that release:

- ``verified``: the patch's tests passed there (``static``: checked from the release's artifacts only);
- ``native``: upstream has the behaviour there; nothing is installed;
- ``unsupported``: no variant's range holds the release, or it is recorded as unsupported or known bad;
- ``untested``: a variant's range holds the release, but nothing was recorded there.

The releases of an upstream are those any record of the matrix names; a patch's row is in the grid
of the upstream its variants require first (``megatron.tms_hook_mode``: megatron-core).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from importlib import resources
from typing import Iterable, Mapping

from ..runtime import pep440
from ..runtime.catalogue import Registered
from .model import NATIVE, VERIFIED, Matrix, VersionRecord

VERIFIED_STATIC = "static"
UNSUPPORTED = "unsupported"
UNTESTED = "untested"
#: Verdicts in the order a legend lists them, with the Markdown mark and what it means.
LEGEND: tuple[tuple[str, str, str], ...] = (
    (VERIFIED, "✅", "verified: the patch's tests passed on this release"),
    (VERIFIED_STATIC, "☑️", "verified from the release's files only (targets, signatures, fingerprints)"),
    (NATIVE, "🟦", "native: upstream has the behaviour; nothing is installed"),
    (UNSUPPORTED, "⛔", "unsupported: no variant covers this release (the patch is skipped)"),
    (UNTESTED, "❔", "untested: a variant's range holds this release, nothing recorded there"),
)
MARK = {verdict: mark for verdict, mark, _ in LEGEND}
#: Where the main upstreams come first, in the order the README names them.
UPSTREAM_ORDER = ("megatron-core", "megatron-bridge", "nvidia-modelopt", "vllm")
GENERATED = "Generated from compat_matrix.yaml by `patchkit matrix grid`; do not edit by hand."


@dataclass(frozen=True)
class Row:
    patch_id: str
    opt_in: bool
    cells: tuple[str, ...]


@dataclass(frozen=True)
class Section:
    """One upstream's grid: its releases (oldest first) and one row per patch of that upstream."""

    upstream: str
    releases: tuple[str, ...]
    rows: tuple[Row, ...]


def _is_static(record: VersionRecord) -> bool:
    return bool(record.verified_by) and not any(s.startswith("tests:") for s in record.verified_by)


def _verdict(patch: Registered, records: Iterable[VersionRecord], upstream: str, release: str) -> str:
    here = [r for r in records if r.versions.get(upstream) == release]
    statuses = {r.status for r in here}
    if VERIFIED in statuses:
        tested = any(r.status == VERIFIED and not _is_static(r) for r in here)
        return VERIFIED if tested else VERIFIED_STATIC
    if NATIVE in statuses:
        return NATIVE
    if here:
        return UNSUPPORTED  # recorded, but neither verified nor native there: known bad or unsupported
    covered = any(upstream in v.requires and pep440.SpecifierSet(v.requires[upstream]).contains(release)
                  for v in patch.patch.variants)
    return UNTESTED if covered else UNSUPPORTED


def build(matrix: Matrix, registry: Iterable[Registered]) -> list[Section]:
    """The grid's sections, one per upstream a patch requires first."""
    by_upstream: dict[str, list[Registered]] = {}
    for registered in sorted(registry, key=lambda r: r.patch.id):
        dists = registered.patch.distributions
        if dists:
            by_upstream.setdefault(dists[0], []).append(registered)
    sections = []
    order = {name: i for i, name in enumerate(UPSTREAM_ORDER)}
    for upstream in sorted(by_upstream, key=lambda u: (order.get(u, len(order)), u)):
        patches = by_upstream[upstream]
        records = {r.patch.id: [rec for variant in matrix.patches.get(r.patch.id, {}).values() for rec in variant]
                   for r in patches}
        seen = {rec.versions[upstream] for variants in matrix.patches.values() for recs in variants.values()
                for rec in recs if upstream in rec.versions}
        releases = tuple(sorted(seen, key=lambda v: pep440.parse(v).key()))
        rows = tuple(Row(r.patch.id, r.patch.opt_in,
                         tuple(_verdict(r, records[r.patch.id], upstream, release) for release in releases))
                     for r in patches)
        sections.append(Section(upstream, releases, rows))
    return sections


def _totals(sections: Iterable[Section]) -> Mapping[str, int]:
    counts = {verdict: 0 for verdict, _, _ in LEGEND}
    for section in sections:
        for row in section.rows:
            for cell in row.cells:
                counts[cell] += 1
    return counts


def render_markdown(sections: list[Section]) -> str:
    """The grid as a Markdown page: a legend, then one table per upstream."""
    lines = [
        "# Compatibility grid",
        "",
        f"<!-- {GENERATED} -->",
        "",
        "Every patch of the catalogue against every upstream release the compatibility matrix",
        "(`compat_matrix.yaml`) records, one table per upstream. The same grid as a standalone page:",
        "[compatibility.html](compatibility.html). Per variant, with the versions each was checked on:",
        "[compat-matrix.md](compat-matrix.md#supported-versions).",
        "",
        "| mark | meaning |",
        "|---|---|",
        *(f"| {mark} | {meaning} |" for _, mark, meaning in LEGEND),
        "",
        "Opt-in patches (off until switched on) are marked *(opt-in)*.",
    ]
    for section in sections:
        lines += ["", f"## {section.upstream}", "",
                  "| patch | " + " | ".join(section.releases) + " |",
                  "|---|" + "---|" * len(section.releases)]
        for row in section.rows:
            name = f"`{row.patch_id}`" + (" *(opt-in)*" if row.opt_in else "")
            lines.append(f"| {name} | " + " | ".join(MARK[c] for c in row.cells) + " |")
    counts = _totals(sections)
    lines += ["", "Cells: " + ", ".join(f"{counts[v]} {v}" for v, _, _ in LEGEND) + ".", ""]
    return "\n".join(lines)


#: The HTML page's stylesheet, a data file of this package (shipped in the wheel).
STYLESHEET = "grid.css"
_SHORT = {VERIFIED: "✓", VERIFIED_STATIC: "s", NATIVE: "N", UNSUPPORTED: "–", UNTESTED: "?"}
_SWATCH = {VERIFIED: "#2da44e", VERIFIED_STATIC: "#aceebb", NATIVE: "#54aeff", UNSUPPORTED: "#eaeef2",
           UNTESTED: "#fff8c5"}


def _inline_style() -> str:
    """The stylesheet as one line for the page's ``<style>``: its comments dropped, its whitespace collapsed."""
    text = resources.files("patchkit.matrix").joinpath(STYLESHEET).read_text(encoding="utf-8")
    return " ".join(re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL).split())


def render_html(sections: list[Section]) -> str:
    """The grid as one self-contained HTML page (inline style, no script, no external resource)."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>patchkit-rl compatibility grid</title>", f"<style>{_inline_style()}</style>", "</head>",
           "<body>",
           f"<!-- {esc(GENERATED)} -->",
           "<h1>patchkit-rl compatibility grid</h1>",
           '<p class="note">Every patch against every upstream release recorded in compat_matrix.yaml.</p>',
           '<ul class="legend">']
    out += [f'<li><span style="background:{_SWATCH[v]}"></span>{_SHORT[v]} {esc(meaning)}</li>'
            for v, _, meaning in LEGEND]
    out.append("</ul>")
    for section in sections:
        out += [f"<h2>{esc(section.upstream)}</h2>", "<table>", "<thead><tr><th>patch</th>"
                + "".join(f'<th class="release">{esc(r)}</th>' for r in section.releases) + "</tr></thead>",
                "<tbody>"]
        for row in section.rows:
            name = esc(row.patch_id) + (" <em>opt-in</em>" if row.opt_in else "")
            cells = "".join(f'<td class="{c}" title="{esc(row.patch_id)} on {esc(section.upstream)} {esc(r)}: {c}">'
                            f"{_SHORT[c]}</td>" for c, r in zip(row.cells, section.releases, strict=True))
            out.append(f'<tr><td class="patch">{name}</td>{cells}</tr>')
        out += ["</tbody>", "</table>"]
    counts = _totals(sections)
    out += ['<p class="note">Cells: ' + esc(", ".join(f"{counts[v]} {v}" for v, _, _ in LEGEND)) + ".</p>",
            "</body>", "</html>", ""]
    return "\n".join(out)
