"""The first ``patchkit.apply_all()`` of a process when the catalogue's index is broken, missing or stale.

The start-up pass reads the index alone; whatever it cannot read must reach the engine, which reads
the declarations instead, as it always did: ``apply_all()`` never raises for a broken index, and it
records what the engine records. Each case runs a copy of this patchkit, its index damaged, in a fresh
interpreter, once through ``patchkit.apply_all()`` and once through the engine directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import patchkit.patches
import pytest

import patchkit

CALL = """
    import json
    import patchkit
    try:
        statuses = [s.to_dict() for s in {call}]
    except BaseException as exc:
        statuses = repr(exc)
    print(json.dumps({{"statuses": statuses, "later": [s.to_dict() for s in patchkit.status()]}}))
"""


def _damaged_copy(root: Path, damage: str) -> Path:
    """A copy of this patchkit and its catalogue under ``root``, its index damaged as ``damage`` says."""
    package = root / "patchkit"
    shutil.copytree(Path(patchkit.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(patchkit.patches.__path__[0]), package / "patches",
                    ignore=shutil.ignore_patterns("__pycache__"))
    index = package / "patches" / "_index.py"
    if damage == "not python":
        index.write_text(index.read_text() + "\nthis is not python(\n")
    elif damage == "raises on import":
        index.write_text(index.read_text() + "\nraise ImportError('half-written index')\n")
    elif damage == "missing":
        index.unlink()
    elif damage == "a declaration module gone":
        (package / "patches" / "megatron" / "gpt" / "output_processor.py").unlink()
    return root


def _run(copy: Path, call: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(CALL.format(call=call))], cwd=copy,
                            capture_output=True, text=True, timeout=120, env={**clean, "PYTHONPATH": str(copy)})
    assert result.returncode == 0, result.stderr
    found: dict = json.loads(result.stdout)
    return found


@pytest.mark.parametrize("damage", ["not python", "raises on import", "missing", "a declaration module gone"])
def test_a_broken_index_costs_the_first_apply_all_nothing(tmp_path, damage):
    copy = _damaged_copy(tmp_path, damage)
    first = _run(copy, "patchkit.apply_all()")
    engine = _run(copy, "patchkit.engine().apply_all()")
    assert isinstance(first["statuses"], list), first["statuses"]
    assert first == engine
    assert any(s["id"] == "megatron.mtp_postprocess" for s in first["later"])


INTERRUPTED_TAKE_OVER = """
    import gc, sys
    import patchkit
    from patchkit.runtime import import_watch
    patchkit.apply_all()
    calls = []

    def interrupt_the_second_settle(frame, event, arg):  # Ctrl-C while the engine takes over, as a signal lands
        if event == "call" and frame.f_code.co_name == "_settle":
            calls.append(frame)
            if len(calls) == 2:
                sys.settrace(None)
                raise KeyboardInterrupt
        return None

    sys.settrace(interrupt_the_second_settle)
    try:
        patchkit.status()
    except KeyboardInterrupt as exc:
        kept = exc  # what a REPL (sys.last_value) or a test runner keeps, and the half-built engine with it
    sys.settrace(None)
    assert len(calls) == 2, len(calls)
    patchkit.status()
    gc.collect()
    print(sum(type(listener).__name__ == "Engine" for listener in import_watch._LISTENERS))
"""


def test_an_engine_interrupted_while_taking_over_hears_no_import():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(INTERRUPTED_TAKE_OVER)], capture_output=True,
                            text=True, timeout=120, env=clean)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1"]  # the engine built on the retry, alone: each import installs once


HOOK_ASKING_DURING_THE_BUILD = """
    import sys
    import patchkit
    from patchkit.runtime import hooks
    patchkit.apply_all()
    assert "threading" not in sys.modules  # start-up left it out; building the engine imports it
    answers = []

    def ask_patchkit(module):  # a post-import hook of another library, calling into patchkit
        try:
            answers.append(len(patchkit.status()))
        except ImportError as exc:  # the engine's own module is half-imported in this thread
            answers.append(type(exc).__name__)

    hooks.register("threading", ask_patchkit)
    print(len(patchkit.status()), answers)
"""


def test_a_hook_asking_for_the_engine_while_it_is_built_does_not_hang():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    try:
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(HOOK_ASKING_DURING_THE_BUILD)],
                                capture_output=True, text=True, timeout=60, env=clean)
    except subprocess.TimeoutExpired:
        pytest.fail("patchkit.status() hung: the hook waited for the lock its own thread held")
    assert result.returncode == 0, result.stderr
    count, answers = result.stdout.split(maxsplit=1)
    assert int(count) > 0 and answers.strip() == "['ImportError']"
