"""A test session runs the tests named after ``--``, not its whole folder as well."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from devtools.pytest_targets import pytest_targets  # noqa: E402


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "tests" / "vllm").mkdir(parents=True)
    (tmp_path / "tests" / "vllm" / "test_refit.py").write_text("")
    return tmp_path


def test_a_named_file_replaces_the_environment_folders(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert pytest_targets(["tests/vllm"], ["tests/vllm/test_refit.py"], root) == ["tests/vllm/test_refit.py"]


def test_a_node_id_replaces_them_and_options_stay(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    posargs = ["-x", "tests/vllm/test_refit.py::test_one", "-k", "dense"]
    assert pytest_targets(["tests/vllm", "tests/e2e"], posargs, root) == posargs


def test_options_alone_narrow_the_environment_folders(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert pytest_targets(["tests/vllm"], ["-x", "-k", "refit"], root) == ["tests/vllm", "-x", "-k", "refit"]


def test_no_posargs_runs_the_environment_folders(tmp_path: Path) -> None:
    assert pytest_targets(["tests/vllm"], [], _tree(tmp_path)) == ["tests/vllm"]


def test_an_option_value_that_is_no_path_is_not_taken_for_a_test(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert pytest_targets(["tests/vllm"], ["-m", "gpu"], root) == ["tests/vllm", "-m", "gpu"]
