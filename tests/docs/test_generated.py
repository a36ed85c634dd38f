"""The generated parts of the documentation are current: the catalogue table (docs/catalogue.md) and
its summary in the README, the supported-versions table and the compatibility grid (Markdown and
HTML). `python3 -m nox -s docs` regenerates them."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit.matrix import grid, load, table
from patchkit.runtime.catalogue import scan as load_catalogue

ROOT = Path(__file__).resolve().parents[2]
STALE = "stale: run `python3 -m nox -s docs` and commit the result"


@pytest.fixture(scope="module")
def matrix():
    return load(ROOT / "compat_matrix.yaml")


@pytest.fixture(scope="module")
def registry():
    patches, errors = load_catalogue()
    assert errors == []
    return patches


def test_the_catalogue_table_is_current(matrix, registry) -> None:
    page = (ROOT / "docs" / "catalogue.md").read_text(encoding="utf-8")
    assert table.has_markers(page, table.CATALOGUE_START, table.CATALOGUE_END)
    assert table.update_catalogue(page, matrix, registry) == page, f"docs/catalogue.md catalogue table is {STALE}"


def test_the_catalogue_table_lists_every_patch(registry) -> None:
    page = (ROOT / "docs" / "catalogue.md").read_text(encoding="utf-8")
    missing = [r.patch.id for r in registry if f"| `{r.patch.id}` |" not in page]
    assert missing == []


def test_the_readme_catalogue_summary_is_current(matrix, registry) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert table.has_markers(readme, table.SUMMARY_START, table.SUMMARY_END)
    assert table.update_summary(readme, matrix, registry) == readme, f"README.md catalogue summary is {STALE}"


def test_the_supported_versions_table_is_current(matrix, registry) -> None:
    page = (ROOT / "docs" / "compat-matrix.md").read_text(encoding="utf-8")
    assert table.update(page, matrix, "compat-matrix.md", table.ranges_of(registry)) == page, \
        f"docs/compat-matrix.md supported-versions table is {STALE}"


@pytest.mark.parametrize(("name", "render"), [("compatibility.md", grid.render_markdown),
                                              ("compatibility.html", grid.render_html)])
def test_the_compatibility_grid_is_current(matrix, registry, name, render) -> None:
    expected = render(grid.build(matrix, registry))
    assert (ROOT / "docs" / name).read_text(encoding="utf-8") == expected, f"docs/{name} is {STALE}"


def test_the_grid_shows_every_patch_and_every_recorded_release(matrix, registry) -> None:
    html = (ROOT / "docs" / "compatibility.html").read_text(encoding="utf-8")
    sections = grid.build(matrix, registry)
    for registered in registry:
        assert f'<td class="patch">{registered.patch.id}' in html
    for section in sections:
        recorded = {r.versions[section.upstream] for variants in matrix.patches.values()
                    for records in variants.values() for r in records if section.upstream in r.versions}
        assert set(section.releases) == recorded
        for release in recorded:
            assert f'<th class="release">{release}</th>' in html
