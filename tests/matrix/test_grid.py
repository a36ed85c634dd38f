"""The compatibility grid: one verdict per patch and recorded release, as Markdown and as HTML."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

from patchkit.matrix import grid
from patchkit.matrix.grid import (
    NATIVE,
    UNSUPPORTED,
    UNTESTED,
    VERIFIED,
    VERIFIED_STATIC,
    build,
    render_html,
    render_markdown,
)
from patchkit.matrix.schema import parse
from patchkit.matrix.table import CATALOGUE_END, CATALOGUE_START, render_catalogue, update_catalogue
from patchkit.runtime.catalogue import Registered
from patchkit.runtime.declaration import Patch, Variant

from .conftest import SMALL_MATRIX


def _registry() -> list[Registered]:
    refit = Patch("vllm.refit", "Refit layers in place. More words.", "why", "up", "never",
                  (Variant({"vllm": ">=0.12,<0.16"}, ("x",)), Variant({"vllm": ">=0.16,<0.20"}, native="has it")))
    fix = Patch("megatron.fix", "Fix a thing | with a pipe.", "why", "up", "never",
                (Variant({"megatron-core": ">=0.14,<0.20"}, ("x",)),), opt_in=True)
    return [Registered(refit, None), Registered(fix, None)]


def test_each_cell_says_verified_static_native_unsupported_or_untested() -> None:
    known_bad = "      - {versions: {vllm: '0.15.1'}, status: known-bad}"
    matrix = parse(SMALL_MATRIX.replace(known_bad, known_bad
                                        + "\n      - {versions: {vllm: '0.11.0'}, status: unsupported}"
                                          "\n      - {versions: {vllm: '0.17.0'}, status: native}"))
    sections = {s.upstream: s for s in build(matrix, _registry())}
    assert list(sections) == ["megatron-core", "vllm"]  # the main upstreams in the README's order
    vllm = sections["vllm"]
    assert vllm.releases == ("0.11.0", "0.12.0", "0.13.0", "0.15.1", "0.16.0", "0.17.0")
    (row,) = vllm.rows
    assert dict(zip(vllm.releases, row.cells, strict=True)) == {
        "0.11.0": UNSUPPORTED,  # recorded unsupported
        "0.12.0": VERIFIED,  # its tests ran there
        "0.13.0": VERIFIED_STATIC,  # checked from the release's files only
        "0.15.1": UNSUPPORTED,  # known bad
        "0.16.0": NATIVE,
        "0.17.0": NATIVE,
    }


def test_a_release_no_record_names_is_untested_inside_a_range_and_unsupported_outside() -> None:
    matrix = parse(SMALL_MATRIX + "  other.patch:\n    'vllm>=0.30':\n"
                   "      - {versions: {vllm: '0.14.0'}, status: unsupported}\n"
                   "      - {versions: {vllm: '0.25.0'}, status: unsupported}\n")
    vllm = {s.upstream: s for s in build(matrix, _registry())}["vllm"]
    cells = dict(zip(vllm.releases, vllm.rows[0].cells, strict=True))
    assert cells["0.14.0"] == UNTESTED  # vllm.refit's first range holds it, nothing recorded for it
    assert cells["0.25.0"] == UNSUPPORTED  # no vllm.refit variant holds it


def test_the_markdown_page_has_a_table_per_upstream_and_marks_opt_ins() -> None:
    page = render_markdown(build(parse(SMALL_MATRIX), _registry()))
    assert "## vllm\n\n| patch | 0.12.0 | 0.13.0 | 0.15.1 | 0.16.0 |\n|---|---|---|---|---|" in page
    assert "| `vllm.refit` | ✅ | ☑️ | ⛔ | 🟦 |" in page
    assert "| `megatron.fix` *(opt-in)* | ✅ |" in page
    assert "Cells: 2 verified, 1 static, 1 native, 1 unsupported, 0 untested." in page


class _Cells(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.cells: list[tuple[str, str]] = []
        self.external: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "td" and found.get("class") != "patch":
            self.cells.append((found.get("class") or "", found.get("title") or ""))
        if tag in ("link", "script", "img") or (found.get("src") or found.get("href") or "").startswith("http"):
            self.external.append(tag)


def test_the_html_page_is_self_contained_and_titles_every_cell() -> None:
    page = render_html(build(parse(SMALL_MATRIX), _registry()))
    parser = _Cells()
    parser.feed(page)
    assert parser.external == []
    assert ("verified", "vllm.refit on vllm 0.12.0: verified") in parser.cells
    assert ("native", "vllm.refit on vllm 0.16.0: native") in parser.cells
    assert len(parser.cells) == 5 and page.startswith("<!DOCTYPE html>")


def test_the_html_page_inlines_every_rule_of_the_packaged_stylesheet() -> None:
    stylesheet = (Path(grid.__file__).parent / grid.STYLESHEET).read_text(encoding="utf-8")
    page = render_html(build(parse(SMALL_MATRIX), _registry()))
    (style,) = re.findall(r"<style>(.*)</style>", page)
    assert "/*" not in style  # the stylesheet's own comment stays out of the page
    for rule in ("td.verified { background: #2da44e; color: #fff; }", "th.release { writing-mode: vertical-rl;"):
        assert rule in stylesheet and rule in style


def test_the_catalogue_table_has_one_row_per_patch_with_its_checked_span() -> None:
    table = render_catalogue(parse(SMALL_MATRIX), _registry())
    assert "| `vllm.refit` | vllm | 0.12.0 – 0.16.0 | on | Refit layers in place |" in table
    assert "| `megatron.fix` | megatron-core | 0.14.0 | opt-in | Fix a thing \\| with a pipe |" in table
    readme = f"# T\n\n{CATALOGUE_START}\nold\n{CATALOGUE_END}\n\nafter\n"
    updated = update_catalogue(readme, parse(SMALL_MATRIX), _registry())
    assert updated.startswith(f"# T\n\n{CATALOGUE_START}\n<!-- generated")
    assert updated.endswith(f"{CATALOGUE_END}\n\nafter\n")
