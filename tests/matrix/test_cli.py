"""`patchkit matrix ...` as a user runs it: exit codes and messages."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _an_upstream_is_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    for distribution in ("megatron-core", "megatron-bridge", "nvidia-modelopt", "vllm"):
        try:
            version(distribution)
        except PackageNotFoundError:
            continue
        return True
    return False


@pytest.mark.skipif(_an_upstream_is_installed(),
                    reason="records the `matrix` environment, which has no upstream installed: run in its own venv")
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


def _check(path: str) -> subprocess.CompletedProcess:
    # A fresh interpreter: a composer that overflows the C stack kills the process, not a test.
    return subprocess.run([sys.executable, "-m", "patchkit", "matrix", "check", "--matrix", path],
                          capture_output=True, text=True, timeout=120)


def _cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    base = "environments:\n  e:\n    install: []\n    tests: [t]\n"
    cases = {
        "hex int": ("schema: 0x1\n" + base, ":1:9: schema: expected 1"),
        "base-60 int": ("schema: 1:00\n" + base, ":1:9: schema: expected 1"),
        "binary int": ("schema: 0b1\n" + base, ":1:9: schema: expected 1"),
        "latin-1 byte": (b"schema: 1\n" + base.encode() + b"    description: caf\xe9\n", ":6:21: the file: "
                         "expected UTF-8 text, found the byte b'\\xe9'"),
        "nested lists": ("[" * 50_000 + "]" * 50_000 + "\n", ":1:65: the file: expected at most 64 nested"),
    }
    made = {}
    for name, (content, expected) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        made[name] = (path, expected)
    return made


@pytest.mark.parametrize("case", ["hex int", "base-60 int", "binary int", "latin-1 byte", "nested lists"])
def test_odd_matrix_files_are_matrix_errors_with_a_position_and_exit_2(tmp_path: Path, case: str) -> None:
    path, expected = _cases(tmp_path)[case]
    result = _check(str(path))
    assert result.returncode == 2, result.stderr
    assert f"{path}{expected}" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("make", "found"), [
    (lambda tmp: tmp / "missing.yaml", "found no such file"),
    (lambda tmp: tmp, "found a directory"),
])
def test_a_missing_matrix_or_a_directory_is_a_matrix_error_exit_2(tmp_path: Path, make, found) -> None:
    path = make(tmp_path)
    result = _check(str(path))
    assert result.returncode == 2, result.stderr
    assert f"{path}:1:1: the file: expected a readable YAML file, {found}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_deep_matrix_is_refused_before_it_is_composed_in_process(tmp_path: Path) -> None:
    from patchkit.matrix import MatrixError, load

    path = tmp_path / "deep.yaml"
    path.write_text("- " * 50_000 + "x\n")  # block lists, nested on one line
    with pytest.raises(MatrixError, match="at most 64 nested"):
        load(path)


def test_strict_mode_gets_a_matrix_error_from_a_malformed_matrix(tmp_path: Path, make_dist) -> None:
    from patchkit import Engine, Patch, Replace, Variant
    from patchkit.matrix import MatrixError
    from patchkit.matrix.index import source

    dist = make_dist()
    path = tmp_path / "bad.yaml"
    path.write_text("schema: 0x1\nenvironments: {}\n")
    engine = Engine(matrix=source(path))
    engine.register(Patch(id="toy.forward", summary="s", why="w", upstream="u", removal="r",
                          variants=(Variant(requires={dist.name: ">=1"},
                                            installs=(Replace(dist.target("Model.forward"), print),)),)))
    importlib.import_module(dist.core)
    with pytest.raises(MatrixError, match="schema"):
        engine.apply_all(strict=True)
    engine.revert_all()


@pytest.mark.parametrize("c_loader", ["refuses at its own limit", "absent"])
def test_the_depth_error_is_patchkits_whatever_pyyamls_c_loader_does(tmp_path: Path, monkeypatch, c_loader) -> None:
    # PyYAML 6.0.4's libyaml stops at 1,000 nested flow collections with its own ScannerError, found
    # while scanning ahead; a PyYAML built without libyaml has no CSafeLoader at all.
    import yaml

    from patchkit.matrix import MatrixError, load

    class LimitedLoader(yaml.SafeLoader):
        def check_event(self, *choices):
            raise yaml.scanner.ScannerError("while increasing flow level", None, "exceeded maximum nesting depth",
                                            yaml.Mark("x", 0, 0, 1000, None, None))

    if c_loader == "absent":
        monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    else:
        monkeypatch.setattr(yaml, "CSafeLoader", LimitedLoader, raising=False)
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(MatrixError, match=r":1:65: the file: expected at most 64 nested"):
        load(path)
