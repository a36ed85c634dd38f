"""Bad input to `patchkit doctor`: one typed error line and exit 2, before any check runs.

`--record FILE` into a path that cannot be written; a `--timeout` that is not a positive number.

Before, the doctor ran every check, then died on the write with a traceback and exit status 1 (the
status that means "a patch failed").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def doctor(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "patchkit", "doctor", "--patch", "bridge.*", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("where", ["missing-folder", "a-directory", "under-a-file", "full-device"])
def test_an_unwritable_record_path_is_a_typed_error_and_exit_2(tmp_path: Path, where: str) -> None:
    (tmp_path / "file").write_text("x")
    path = {"missing-folder": tmp_path / "no" / "such" / "r.yaml", "a-directory": tmp_path,
            "under-a-file": tmp_path / "file" / "r.yaml", "full-device": Path("/dev/full")}[where]
    if where == "full-device" and not path.exists():
        pytest.skip("no /dev/full here")
    done = doctor("--record", str(path))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("patchkit:")]
    assert f"--record='{path}' is not writable" in line


def test_a_writable_record_path_still_gets_its_records(tmp_path: Path) -> None:
    done = doctor("--record", str(tmp_path / "r.yaml"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.yaml").read_text().startswith("# Written by `patchkit doctor --record`")


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(timeout: str) -> None:
    """Before, it was accepted: every check then "did not finish within -1 s" (or never timed out)."""
    done = doctor("--timeout", timeout)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"patchkit: --timeout='{float(timeout)}' is malformed")
