"""The start-up hook ships where ``site`` runs it: at the root of the wheel, and in this
environment's site-packages (an editable install here, as nox and CI install patchkit)."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from patchkit.processes.launcher import HOOK_NAME, hook_installed

ROOT = Path(__file__).resolve().parents[2]


def setup_constants() -> dict[str, str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    return {target.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name) and target.id.startswith("HOOK_")}


def test_the_installed_hook_is_the_one_setup_py_writes():
    constants = setup_constants()
    assert constants["HOOK_NAME"] == HOOK_NAME
    installed = hook_installed()
    assert installed is not None and installed.read_text() == constants["HOOK_LINE"]


def test_the_hook_line_checks_the_variable_before_importing_anything():
    line = setup_constants()["HOOK_LINE"]
    assert line.startswith("import os; 'PATCHKIT_AUTOLOAD' in os.environ and __import__(")
    assert line.count("\n") == 1  # site runs a .pth line by line: the hook must be one line


@pytest.mark.slow
def test_the_wheel_carries_the_hook_at_its_root_and_records_it(tmp_path):
    pytest.importorskip("setuptools")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                             "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("patchkit_rl-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(HOOK_NAME).decode() == setup_constants()["HOOK_LINE"]
        record = next(name for name in archive.namelist() if name.endswith(".dist-info/RECORD"))
        assert f"{HOOK_NAME}," in archive.read(record).decode()
