"""`patchkit matrix ...` as a user runs it: exit codes and messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from patchkit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_check_and_record_check_pass_on_the_repository_matrix(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["matrix", "check"]) == 0
    assert "registry and matrix agree" in capsys.readouterr().out
    assert main(["matrix", "record", "--env", "matrix", "--check"]) == 0


def test_a_malformed_matrix_exits_2_naming_the_position(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "compat_matrix.yaml"
    bad.write_text("schema: 1\nenvironments:\n  e:\n    install: []\n    tests: [t]\n    ci: sometimes\n")
    assert main(["matrix", "check", "--matrix", str(bad)]) == 2
    expected = f"{bad}:6:9: environments.e.ci: expected true or false, found a string 'sometimes'"
    assert expected in capsys.readouterr().err


def test_record_check_fails_on_a_stale_matrix_and_write_mode_fixes_it(tmp_path: Path, capsys) -> None:
    stale = tmp_path / "compat_matrix.yaml"
    stale.write_text("schema: 1\nenvironments:\n  e:\n    install: []\n    tests: [t]\n")
    args = ["matrix", "record", "--env", "e", "--matrix", str(stale)]
    assert main([*args, "--check"]) == 1
    assert "is stale" in capsys.readouterr().out
    assert main(args) == 0
    assert main([*args, "--check"]) == 0


def test_the_command_line_entry_point_lists_the_matrix_commands() -> None:
    result = subprocess.run([sys.executable, "-m", "patchkit", "matrix", "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    for command in ("check", "record", "static", "table"):
        assert command in result.stdout
