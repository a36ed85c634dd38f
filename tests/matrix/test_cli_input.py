"""Bad input to the matrix commands: one typed error line and exit 2, never a traceback with exit 1.

Files named on the command line that are missing, folders, not UTF-8, not YAML or not of the
expected shape; files that cannot be written.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def patchkit(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "patchkit", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def bad_files(tmp_path: Path) -> dict[str, Path]:
    files = {"missing": tmp_path / "missing.yaml", "folder": tmp_path / "folder", "latin-1": tmp_path / "l1.yaml",
             "not-yaml": tmp_path / "bad.yaml", "a-list": tmp_path / "list.yaml"}
    files["folder"].mkdir()
    files["latin-1"].write_bytes(b"caf\xe9: 1\n")
    files["not-yaml"].write_text("vllm: [\n")
    files["a-list"].write_text("- vllm\n")
    return files


@pytest.mark.parametrize("case", ["missing", "folder", "latin-1", "not-yaml", "a-list"])
def test_a_bad_symbols_file_is_a_typed_error(tmp_path: Path, case: str) -> None:
    path = bad_files(tmp_path)[case]
    done = patchkit("matrix", "static", "--symbols", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"patchkit: --symbols='{path}' is ") and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("case", ["missing", "folder", "latin-1"])
def test_a_bad_readme_for_the_table_is_a_typed_error(tmp_path: Path, case: str) -> None:
    path = bad_files(tmp_path)[case]
    done = patchkit("matrix", "table", "--readme", str(path))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"patchkit: --readme='{path}' is unreadable")


def test_a_file_that_cannot_be_written_is_a_typed_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The README of `table` (the matrix of `record`/`merge` goes the same way) where writing fails:
    the OS refusal is simulated, as this suite may run as root, which writes read-only files."""
    from patchkit.cli import main

    readme = tmp_path / "README.md"
    readme.write_text("<!-- compat-table:start -->\n<!-- compat-table:end -->\n")
    write_text = Path.write_text

    def refused(self: Path, *args: object, **kwargs: object) -> int:
        if self == readme:
            raise PermissionError(13, "Permission denied")
        return write_text(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", refused)
    assert main(["matrix", "table", "--readme", str(readme), "--matrix", str(ROOT / "compat_matrix.yaml")]) == 2
    assert capsys.readouterr().err == (f"patchkit: --readme='{readme}' is not writable (Permission denied); "
                                       "accepted: a file that can be written\n")


@pytest.mark.parametrize("missing", ["--matrix", "FILE"])
def test_merge_with_a_missing_file_is_one_line_and_exit_2(tmp_path: Path, missing: str) -> None:
    contribution = tmp_path / "doctor.yaml"
    contribution.write_text("schema: 1\nenvironments: {}\n")
    matrix = tmp_path / "missing.yaml" if missing == "--matrix" else ROOT / "compat_matrix.yaml"
    named = tmp_path / "gone.yaml" if missing == "FILE" else contribution
    done = patchkit("matrix", "merge", str(named), "--matrix", str(matrix), "--check")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    gone = matrix if missing == "--matrix" else named
    assert line == f"patchkit: {gone}:1:1: the file: expected a readable YAML file, found no such file"


STALE = "schema: 1\nenvironments:\n  e:\n    install: []\n    tests: [t]\n"


@pytest.mark.parametrize("command", [["record", "--env", "e"], ["merge", "doctor.yaml"], ["index"],
                                     ["static", "--record"]])
def test_the_matrix_of_an_installed_package_is_never_written_by_default(tmp_path: Path, monkeypatch, capsys,
                                                                        command: list[str]) -> None:
    import patchkit.matrix.cli as matrix_cli
    from patchkit.cli import main

    site = tmp_path / "site-packages" / "patchkit"
    site.mkdir(parents=True)
    shipped = site / "compat_matrix.yaml"
    shipped.write_text(STALE)
    (tmp_path / "doctor.yaml").write_text("schema: 1\nenvironments: {}\n")
    monkeypatch.setattr(matrix_cli, "default_path", lambda: shipped)
    (site / "runtime").mkdir()
    index = site / "runtime" / "_recorded.py"
    index.write_text("RECORDS = {}\n")
    monkeypatch.setattr("patchkit.matrix.index.PATH", index)
    monkeypatch.chdir(tmp_path)  # no ./compat_matrix.yaml here
    assert main(["matrix", *command]) == 2
    err = capsys.readouterr().err
    assert err.startswith("patchkit: ") and ("--matrix" in err or "source checkout" in err), err
    assert shipped.read_text() == STALE and index.read_text() == "RECORDS = {}\n"
    # Reading it is fine, and --matrix writes where it is told.
    assert main(["matrix", "record", "--env", "e", "--check"]) == 1
    local = tmp_path / "mine.yaml"
    local.write_text(STALE)
    assert main(["matrix", "record", "--env", "e", "--matrix", str(local)]) == 0 and local.read_text() != STALE


def test_the_repository_matrix_is_the_default_in_a_source_checkout() -> None:
    from patchkit.matrix.cli import in_source_checkout
    from patchkit.matrix.loader import default_path

    shipped = default_path()
    assert shipped is not None and in_source_checkout(shipped)
