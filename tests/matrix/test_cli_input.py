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
