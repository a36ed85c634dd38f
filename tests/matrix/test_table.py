"""The supported-versions table, the catalogue table and its summary are generated between their markers, and a
stale one is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchkit.cli import main
from patchkit.matrix.schema import parse
from patchkit.matrix.table import END, START, render, update

from .conftest import SMALL_MATRIX

README = f"# Title\n\nIntro.\n\n{START}\nold table\n{END}\n\n## After\n"


def test_table_lists_each_variant_with_its_versions_in_order() -> None:
    table = render(parse(SMALL_MATRIX))
    assert "| `vllm.refit` | `vllm>=0.12,<0.16` | vllm 0.12.0; static only: 0.13.0 | — | — |" in table
    assert "| `vllm.refit` | `vllm>=0.16,<0.20` | — | vllm 0.16.0 | vllm 0.15.1 |" in table
    only_static = render(parse(SMALL_MATRIX.replace("['tests:e']", "[static]")))
    assert "| `vllm.refit` | `vllm>=0.12,<0.16` | vllm 0.12.0, 0.13.0 (static only) | — | — |" in only_static


def test_a_labelled_variant_shows_its_declared_range() -> None:
    matrix = parse(SMALL_MATRIX.replace("'vllm>=0.16,<0.20':", "native-reload:"))
    table = render(matrix, {("vllm.refit", "native-reload"): "vllm>=0.16,<0.20"})
    assert "| `vllm.refit` | `native-reload` (vllm>=0.16,<0.20) | — | vllm 0.16.0 | vllm 0.15.1 |" in table


def test_only_the_text_between_the_markers_is_rewritten() -> None:
    updated = update(README, parse(SMALL_MATRIX))
    assert updated.startswith(f"# Title\n\nIntro.\n\n{START}\n") and updated.endswith(f"{END}\n\n## After\n")
    assert "old table" not in updated
    assert update(updated, parse(SMALL_MATRIX)) == updated


def test_a_readme_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="no <!-- compat-table:start -->"):
        update("# Title\n", parse(SMALL_MATRIX))


def test_check_mode_fails_on_a_stale_table_and_passes_once_written(tmp_path: Path, capsys) -> None:
    readme, matrix = tmp_path / "README.md", tmp_path / "compat_matrix.yaml"
    readme.write_text(README)
    matrix.write_text(SMALL_MATRIX)
    args = ["matrix", "table", "--readme", str(readme), "--matrix", str(matrix)]
    assert main([*args, "--check"]) == 1
    assert readme.read_text() == README and "is stale" in capsys.readouterr().out
    assert main(args) == 0
    assert main([*args, "--check"]) == 0


def test_the_summary_has_one_row_per_upstream_whose_counts_add_up_to_the_catalogue(tmp_path: Path) -> None:
    from patchkit.matrix.table import SUMMARY_END, SUMMARY_START
    from patchkit.runtime.catalogue import scan

    readme, matrix = tmp_path / "README.md", tmp_path / "compat_matrix.yaml"
    readme.write_text(f"# Title\n\n{SUMMARY_START}\nold summary\n{SUMMARY_END}\n")
    matrix.write_text(SMALL_MATRIX)
    assert main(["matrix", "table", "--readme", str(readme), "--matrix", str(matrix)]) == 0
    lines = readme.read_text().splitlines()
    rows = [line.split(" | ") for line in lines if line.startswith("| ") and "---" not in line]
    header, *upstreams = rows
    assert header[:2] == ["| upstream", "patches"] and "old summary" not in readme.read_text()
    patches, _ = scan()
    assert sum(int(row[1]) for row in upstreams) == len(patches)
    assert all(int(row[1]) == int(row[2]) + int(row[3]) + int(row[4]) for row in upstreams)
    assert sorted(row[0].removeprefix("| ") for row in upstreams) == sorted(
        {r.patch.distributions[0] for r in patches})


def test_a_document_without_any_table_markers_is_refused(tmp_path: Path, capsys) -> None:
    readme, matrix = tmp_path / "README.md", tmp_path / "compat_matrix.yaml"
    readme.write_text("# Title\n")
    matrix.write_text(SMALL_MATRIX)
    assert main(["matrix", "table", "--readme", str(readme), "--matrix", str(matrix)]) == 2
    assert "catalogue-summary:start" in capsys.readouterr().err
