"""Autoload through the installed .pth hook, in fresh interpreters: what it applies, what it costs
when off, and that no failure or malformed value stops an interpreter from starting."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from procs_toy import AUTOLOAD, REPORT, TOY_PATCHES, toy_entry

from patchkit.processes.autoload import STRICT_EXIT_STATUS


def test_without_the_variable_the_hook_imports_nothing_of_patchkit(toy):
    result = toy.python("import sys; print(sorted(m for m in sys.modules if m.startswith('patchkit')))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_autoload_applies_before_the_first_line_of_user_code(toy):
    report = toy.report(**AUTOLOAD)
    assert report["forward"] == 1001
    entry = toy_entry(report["manifest"])
    assert (entry["id"], entry["state"], entry["versions"]) == ("toy.forward", "applied", {"pkproc-toy": "1.0.0"})
    assert report["manifest"]["autoload"] == {"ran": True, "skipped": "", "extra_modules": ["pkproc_toy.patches"],
                                              "problems": []}


@pytest.mark.parametrize("value", ["0", "off", ""])
def test_autoload_switched_off_applies_nothing(toy, value):
    report = toy.report(PATCHKIT_AUTOLOAD=value, **TOY_PATCHES)
    assert report["forward"] == 2
    assert report["manifest"]["autoload"]["ran"] is False


def test_autoload_does_not_import_torch(toy):
    code = "import sys; print('torch' in sys.modules, 'ray' in sys.modules)"
    result = toy.python(code, **AUTOLOAD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(("variables", "named"), [
    ({"PATCHKIT_AUTOLOAD": "maybe"}, "PATCHKIT_AUTOLOAD='maybe'"),
    ({**AUTOLOAD, "PATCHKIT_DISABLE": "toy forward!"}, "PATCHKIT_DISABLE='toy forward!'"),
    ({**AUTOLOAD, "PATCHKIT_LOG_LEVEL": "LOUD"}, "PATCHKIT_LOG_LEVEL='LOUD'"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy/patches"}, "PATCHKIT_EXTRA_PATCHES='pkproc_toy/patches'"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.nosuch,pkproc_toy.patches"}, "pkproc_toy.nosuch"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.failing"}, "toy patch exploded at start-up"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.patches,pkproc_toy.clash"}, "already registered: toy.forward"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.exiting,pkproc_toy.patches"}, "SystemExit(2)"),
    ({**AUTOLOAD, "PATCHKIT_LOG_LEVEL": "\u00b2"}, "PATCHKIT_LOG_LEVEL='\u00b2'"),
    ({**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.patches,,x"}, "(empty entry)"),
])
def test_a_bad_value_or_a_failing_patch_is_reported_and_the_interpreter_starts(toy, variables, named):
    code = ("import json, patchkit.processes.autoload as a; print('user code ran'); "
            "print(json.dumps(a.outcome().to_dict()))")
    result = toy.python(code, **variables)
    assert result.returncode == 0, result.stderr
    ran, outcome = result.stdout.splitlines()
    assert ran == "user code ran"
    assert named in result.stderr and "patchkit: autoload: 1 problem(s)" in result.stderr
    assert any(named in problem for problem in json.loads(outcome)["problems"])


def test_an_unimportable_patchkit_does_not_stop_the_interpreter(toy, tmp_path):
    # A patchkit shadowed by a broken copy earlier on the path: site reports the hook's error, goes on.
    (tmp_path / "patchkit").mkdir()
    (tmp_path / "patchkit" / "__init__.py").write_text("raise ImportError('broken patchkit copy')\n")
    env = toy.env(**AUTOLOAD)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    result = subprocess.run([sys.executable, "-c", "print('user code ran')"], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "user code ran"
    assert "zz_patchkit_autoload.pth" in result.stderr and "broken patchkit copy" in result.stderr


def test_the_good_extra_module_still_applies_next_to_a_missing_one(toy):
    report = toy.report(PATCHKIT_AUTOLOAD="1", PATCHKIT_EXTRA_PATCHES="pkproc_toy.nosuch,pkproc_toy.patches")
    assert report["forward"] == 1001


@pytest.mark.parametrize("variables", [
    {**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.exiting"},
    {**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.patches,,x"},
    {**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.failing"},
    {**AUTOLOAD, "PATCHKIT_EXTRA_PATCHES": "pkproc_toy.nosuch"},
    {**AUTOLOAD, "PATCHKIT_DISABLE": "toy forward!"},
])
def test_strict_mode_stops_the_interpreter_before_user_code(toy, variables):
    result = toy.python("print('user code ran')", PATCHKIT_STRICT="1", **variables)
    assert result.returncode == STRICT_EXIT_STATUS
    assert "user code ran" not in result.stdout
    assert "autoload failed in strict mode" in result.stderr


def test_running_the_hook_again_in_the_same_process_changes_nothing(toy):
    # site reads the hook twice in a venv with a lib64 -> lib symlink; any repeat must be a no-op.
    code = ("import patchkit.processes.autoload as a; before = a.outcome(); a.run_at_startup(); a.load();"
            "assert a.outcome() is before, (before, a.outcome())\n" + REPORT)
    result = toy.python(code, **AUTOLOAD)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["forward"] == 1001


def test_a_process_spawned_during_autoload_does_not_autoload_again(toy):
    code = ("import json, pkproc_toy.spawning as s, patchkit.processes.autoload as a;"
            "print(json.dumps({'child': s.CHILD_OUTCOME, 'parent': a.outcome().to_dict()}))")
    result = toy.python(code, PATCHKIT_AUTOLOAD="1", PATCHKIT_EXTRA_PATCHES="pkproc_toy.spawning,pkproc_toy.patches")
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["parent"]["ran"] is True and seen["parent"]["problems"] == []
    assert seen["child"]["ran"] is False and seen["child"]["skipped"].startswith("spawned while process")


CHILD_FORWARD = ("import subprocess, sys; from pkproc_toy.core import Model;"
                 "child = subprocess.run([sys.executable, '-c', "
                 "'from pkproc_toy.core import Model; print(Model().forward(1))'], capture_output=True, text=True);"
                 "print(Model().forward(1), child.stdout.strip())")


def test_processes_started_after_autoload_autoload_themselves(toy):
    code = CHILD_FORWARD
    result = toy.python(code, **AUTOLOAD)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1001", "1001"]


def test_patchkit_run_makes_the_whole_tree_autoload_and_returns_the_exit_status(toy):
    code = CHILD_FORWARD + "; sys.exit(7)"
    result = subprocess.run([sys.executable, "-m", "patchkit", "run", "--", sys.executable, "-c", code],
                            capture_output=True, text=True, timeout=120, env=toy.env(**TOY_PATCHES))
    assert result.returncode == 7, result.stderr
    assert result.stdout.split() == ["1001", "1001"]


def test_patchkit_run_refuses_a_malformed_variable_before_starting_anything(toy, tmp_path):
    marker = tmp_path / "started"
    result = subprocess.run([sys.executable, "-m", "patchkit", "run", "--", "touch", str(marker)],
                            capture_output=True, text=True, timeout=60,
                            env=toy.env(PATCHKIT_FORCE="toy..forward", **TOY_PATCHES))
    assert result.returncode == 2
    assert "PATCHKIT_FORCE='toy..forward'" in result.stderr
    assert not marker.exists()


def test_patchkit_run_reports_a_missing_command():
    result = subprocess.run([sys.executable, "-m", "patchkit", "run", "--", "no-such-command-pk"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 127 and "command not found: no-such-command-pk" in result.stderr


def test_processes_write_manifests_to_a_folder_that_the_file_check_compares(toy, tmp_path):
    folder = tmp_path / "manifests"
    for extra in ({}, {}, {"PATCHKIT_DISABLE": "toy.forward"}):
        result = toy.python(REPORT, PATCHKIT_MANIFEST_DIR=str(folder), **AUTOLOAD, **extra)
        assert result.returncode == 0, result.stderr
    written = sorted(folder.glob("*.json"))
    assert len(written) == 3
    disabled_pid = json.loads(result.stdout)["manifest"]["process"]["pid"]
    # The checker runs in the job's environment: its own manifest lands in the folder, and is left out.
    check = subprocess.run([sys.executable, "-m", "patchkit.processes.consistency", str(folder)], capture_output=True,
                           text=True, timeout=60, env=toy.env(PATCHKIT_MANIFEST_DIR=str(folder), **AUTOLOAD))
    assert check.returncode == 1
    assert "1 of 3 processes differ" in check.stderr and len(list(folder.glob("*.json"))) == 4
    assert f":{disabled_pid}: toy.forward: state 'skipped', the others 'applied'" in check.stderr


@pytest.mark.parametrize(("ending", "state"), [("", "applied"), ("; os._exit(0)", "pending")])
def test_the_manifest_is_written_at_start_up_and_again_at_exit(toy, tmp_path, ending, state):
    # At start-up the toy patch waits for pkproc_toy.core; the program imports it; the exit write
    # shows it applied. A process killed before its exit handlers leaves the start-up manifest.
    folder = tmp_path / "manifests"
    code = "import os; print(os.getpid(), flush=True); from pkproc_toy.core import Model" + ending
    result = toy.python(code, PATCHKIT_MANIFEST_DIR=str(folder), **AUTOLOAD)
    assert result.returncode == 0, result.stderr
    (written,) = folder.glob(f"*-{result.stdout.strip()}.json")
    entry = toy_entry(json.loads(written.read_text()))
    assert entry["state"] == state


def test_a_declaration_module_that_exits_does_not_kill_the_interpreter(toy):
    result = toy.python(REPORT, PATCHKIT_AUTOLOAD="1", PATCHKIT_EXTRA_PATCHES="pkproc_toy.exiting,pkproc_toy.patches")
    assert result.returncode == 0, result.stderr
    assert "Fatal Python error" not in result.stderr
    report = json.loads(result.stdout)
    assert report["forward"] == 1001  # the other extra module still applied
    assert any("pkproc_toy.exiting" in p and "SystemExit(2)" in p for p in report["manifest"]["autoload"]["problems"])


def test_load_called_again_from_an_extra_package_init_does_not_hang(toy):
    code = ("import json, pkproc_reentrant as r, patchkit.processes.autoload as a;"
            "print(json.dumps({'inner': r.INNER_OUTCOME.to_dict(), 'outer': a.outcome().to_dict()}))\n" + REPORT)
    result = toy.python(code, timeout=60, PATCHKIT_AUTOLOAD="1", PATCHKIT_EXTRA_PATCHES="pkproc_reentrant.patches")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    seen = json.loads(first)
    assert seen["inner"]["ran"] is False and "already running in this thread" in seen["inner"]["skipped"]
    assert seen["outer"]["ran"] is True and seen["outer"]["problems"] == []
    assert json.loads(second)["forward"] == 1001


def test_load_called_again_by_a_driver_from_an_extra_package_init_does_not_hang(toy):
    code = ("import json, patchkit.processes.autoload as a; o = a.load();"
            "import pkproc_reentrant as r; print(json.dumps([o.ran, r.INNER_OUTCOME.ran]))")
    result = toy.python(code, timeout=60, PATCHKIT_EXTRA_PATCHES="pkproc_reentrant.patches")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [True, False]


@pytest.mark.parametrize(("command", "status", "says"), [
    ("not-executable", 126, "Permission denied"),
    ("a-directory", 126, "is a directory"),
    ("", 127, "command not found: ''"),
])
def test_patchkit_run_reports_a_command_it_cannot_start_in_one_line_like_a_shell(tmp_path, command, status, says):
    (tmp_path / "not-executable").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "a-directory").mkdir()
    argv = [str(tmp_path / command)] if command else [""]
    result = subprocess.run([sys.executable, "-m", "patchkit", "run", "--", *argv], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == status, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_malformed_manifest_dir_creates_nothing_and_is_reported(toy, tmp_path):
    result = toy.python("print('user code ran')", PATCHKIT_MANIFEST_DIR=" logs", **AUTOLOAD)
    assert result.returncode == 0 and result.stdout.strip() == "user code ran"
    assert "PATCHKIT_MANIFEST_DIR=' logs'" in result.stderr
    assert not (toy.site / " logs").exists()
