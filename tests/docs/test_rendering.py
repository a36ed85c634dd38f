"""The README (the package's long description) and every page of docs/ render with the package
index's renderer, without a table swallowing what follows it; the README's links survive on the index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .markdown_checks import swallowed_rows, table_problems

markdown = pytest.importorskip("readme_renderer.markdown")

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
REPOSITORY = "https://github.com/patchkit-rl/patchkit-rl/blob/main/"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _render(path: Path) -> str:
    rendered = markdown.render(path.read_text(encoding="utf-8"), variant="GFM")
    assert rendered, f"{path.name}: the package index's renderer produced nothing"
    return rendered


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_document_renders_with_every_table_closed(path: Path) -> None:
    assert table_problems(path.read_text(encoding="utf-8")) == []
    assert swallowed_rows(_render(path)) == []


def test_a_paragraph_written_against_a_table_is_caught() -> None:
    broken = "| a | b |\n|---|---|\n| 1 | 2 |\nA paragraph after the table.\n"
    assert table_problems(broken) == ["line 4: text right after a table becomes a table row; add a blank line"]
    assert swallowed_rows(markdown.render(broken, variant="GFM")) == ["A paragraph after the table."]
    wider = "| a | b |\n|---|---|\n| 1 | 2 | Proven on 0.19 |\n\nAfter.\n"
    assert table_problems(wider) == ["line 3: 3 cells under a 2-cell header; the rest is dropped"]
    assert table_problems(broken.replace("\nA paragraph", "\n\nA paragraph")) == []


def test_the_readme_links_are_absolute_or_in_page_and_name_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", readme, re.M)}
    for target in _LINK.findall(readme):
        if target.startswith("#"):
            assert target[1:] in headings, f"README.md links to a missing section {target}"
            continue
        assert target.startswith("https://"), f"README.md: {target} is relative: dead on the package index"
        if target.startswith(REPOSITORY):
            path = target[len(REPOSITORY):].split("#")[0]
            assert (ROOT / path).is_file(), f"README.md links to {path}, which is not in the repository"


@pytest.mark.parametrize("path", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_the_relative_links_of_a_page_name_files_that_exist(path: Path) -> None:
    for target in _LINK.findall(path.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        assert (path.parent / target.split("#")[0]).exists(), f"{path.name} links to {target}, which does not exist"


def test_the_readme_is_a_guide_under_350_lines() -> None:
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 350
