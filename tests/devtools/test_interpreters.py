"""devtools.interpreters: the Python each nox session needs, found however nox was started.

The interpreters here are small shell scripts that answer the probe the way CPython does (its
version, then ``sys.executable``); the pyenv shim answers only for the versions ``PYENV_VERSION``
selects, as pyenv's does. The case that broke on a fresh machine: nox started through pyenv's
``python3`` shim, which exports ``PYENV_VERSION=<global version>``, so ``python3.12`` on PATH fails.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from devtools.interpreters import find_python, missing_message  # noqa: E402

pytestmark = pytest.mark.skipif(os.name != "posix", reason="shell-script interpreters")


def interpreter(path: Path, version: str, reports: Path | None = None) -> Path:
    """A script answering the probe as CPython ``version`` living at ``reports`` (default: itself)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {version}\necho {reports or path}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def pyenv(tmp_path: Path, *versions: str) -> Path:
    """A pyenv root with these versions installed and a python3.12 shim that obeys PYENV_VERSION."""
    root = tmp_path / "pyenv"
    for version in versions:
        interpreter(root / "versions" / version / "bin" / f"python{version.rsplit('.', 1)[0]}",
                    version.rsplit(".", 1)[0])
    shim = root / "shims" / "python3.12"
    shim.parent.mkdir(parents=True)
    cases = "".join(f'  *":{v}:"*) exec "{root}/versions/{v}/bin/python3.12" "$@";;\n'
                    for v in versions if v.startswith("3.12."))
    shim.write_text(f'#!/bin/sh\ncase ":$PYENV_VERSION:" in\n{cases}esac\n'
                    'echo "pyenv: python3.12: command not found" >&2\nexit 127\n')
    shim.chmod(0o755)
    return root


def environ(tmp_path: Path, root: Path | None, *path: Path, **extra: str) -> dict[str, str]:
    env = {"PATH": os.pathsep.join(str(p) for p in path), "HOME": str(tmp_path / "home"),
           "XDG_DATA_HOME": str(tmp_path / "data")}
    if root is not None:
        env["PYENV_ROOT"] = str(root)
    return {**env, **extra}


def test_through_pyenvs_python3_shim_the_other_versions_are_still_found(tmp_path):
    root = pyenv(tmp_path, "3.11.7", "3.12.1", "3.12.10")
    found = find_python("3.12", environ(tmp_path, root, root / "shims", PYENV_VERSION="3.11.7"))
    assert found == root / "versions" / "3.12.10" / "bin" / "python3.12"  # newest patch release, numerically


def test_a_working_shim_is_resolved_to_the_interpreter_behind_it(tmp_path):
    root = pyenv(tmp_path, "3.12.1")
    found = find_python("3.12", environ(tmp_path, root, root / "shims", PYENV_VERSION="3.12.1"))
    assert found == root / "versions" / "3.12.1" / "bin" / "python3.12"


def test_without_pyenv_version_set_pyenvs_versions_are_found(tmp_path):
    root = pyenv(tmp_path, "3.12.1")
    assert find_python("3.12", environ(tmp_path, root, root / "shims")) == root / "versions/3.12.1/bin/python3.12"


def test_a_uv_managed_python_is_found(tmp_path):
    managed = interpreter(tmp_path / "data/uv/python/cpython-3.13.0-linux-x86_64-gnu/bin/python3.13", "3.13")
    assert find_python("3.13", environ(tmp_path, None, tmp_path / "empty")) == managed


def test_a_plain_python_on_path_is_found_and_a_mislabelled_one_skipped(tmp_path):
    interpreter(tmp_path / "first" / "python3.12", "3.11")  # a link pointing at the wrong version
    plain = interpreter(tmp_path / "second" / "python3.12", "3.12")
    assert find_python("3.12", environ(tmp_path, None, tmp_path / "first", tmp_path / "second")) == plain


def test_a_missing_python_is_none_and_the_message_says_how_to_get_it(tmp_path):
    root = pyenv(tmp_path, "3.11.7")
    assert find_python("3.12", environ(tmp_path, root, root / "shims", PYENV_VERSION="3.11.7")) is None
    message = missing_message("3.12", "environment mcore-0.19")
    assert "Python 3.12 is needed by environment mcore-0.19" in message
    assert "pyenv install 3.12" in message and "uv python install 3.12" in message and "\n" not in message


def script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"#!/bin/sh\n" + body.encode("latin-1"))
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("status", [0, 1])
def test_a_python_printing_bytes_that_are_not_utf8_is_skipped_not_a_crash(tmp_path, status):
    script(tmp_path / "first" / "python3.12", f"printf '\\377\\376 caf\\351\\n'\nexit {status}\n")
    plain = interpreter(tmp_path / "second" / "python3.12", "3.12")
    assert find_python("3.12", environ(tmp_path, None, tmp_path / "first", tmp_path / "second")) == plain


def test_an_interpreter_whose_path_holds_spaces_is_found(tmp_path):
    path = tmp_path / "Program Files" / "my  python" / "python3.12"
    script(path, f'echo 3.12\necho "{path}"\n')
    assert find_python("3.12", environ(tmp_path, None, path.parent)) == path


def test_a_hanging_shim_costs_a_short_bounded_wait_and_one_warning_naming_it(tmp_path, monkeypatch, caplog):
    import time

    import devtools.interpreters as interpreters

    monkeypatch.setattr(interpreters, "PROBE_TIMEOUT", 1.0, raising=False)
    sleep = shutil.which("sleep")
    assert sleep is not None
    hanging = script(tmp_path / "shims" / "python3.12", f"{sleep} 60 &\nwait\n")  # its child holds the pipe too
    plain = interpreter(tmp_path / "second" / "python3.12", "3.12")
    started = time.monotonic()
    assert find_python("3.12", environ(tmp_path, None, hanging.parent, tmp_path / "second")) == plain
    assert time.monotonic() - started < 5
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and str(hanging) in warned[0] and "\n" not in warned[0]


def test_the_default_probe_time_limit_is_short():
    import devtools.interpreters as interpreters

    assert interpreters.PROBE_TIMEOUT <= 5
