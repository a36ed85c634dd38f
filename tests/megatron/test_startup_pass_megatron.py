"""The first ``patchkit.apply_all()`` with megatron-core installed and not imported: settled from the
index, no engine built, and the real upstream patched once its code is imported.

The patches of megatron-core wait for their modules; the import of one (in this thread, in another
thread, or in a forked child) builds the engine inside the post-import hook, which takes over what the
first call settled and installs. Each case runs in a fresh interpreter, so that megatron-core is
imported there for the first time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("megatron.core")

PATCH = "megatron.moe_alltoall_replay_token_count"
SCRIPT = textwrap.dedent('''
    import json, os, sys, threading
    import patchkit
    from patchkit.runtime import process_engine

    PATCH = "megatron.moe_alltoall_replay_token_count"
    TD = "megatron.core.transformer.moe.token_dispatcher"
    first = {s.id: s.to_dict() for s in patchkit.apply_all()}
    built_first = process_engine._engine is not None


    def import_and_report():
        import importlib
        importlib.import_module(TD)
        record = patchkit.status(PATCH)[0]
        return {"state": record.state.value, "error": record.error,
                "installed": bool(patchkit.engine().installed_actions(PATCH))}


    mode = sys.argv[1]
    if mode == "thread":
        found = {}
        worker = threading.Thread(target=lambda: found.update(import_and_report()))
        worker.start()
        worker.join(600)
    elif mode == "fork":
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.write(write, json.dumps(import_and_report()).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(child, 0)
        found = json.loads(os.read(read, 1 << 16).decode())
    else:
        found = import_and_report()
    sys.stdout.write(json.dumps({"first": first, "built_first": built_first, "after": found}))
''')


def _run(*args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", *args], capture_output=True, text=True,
                            timeout=900, env=env)
    assert result.returncode == 0, result.stderr
    found: dict = json.loads(result.stdout)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["this thread", "thread", "fork"])
def test_the_first_apply_all_waits_without_an_engine_and_the_import_installs(mode):
    found = _run(SCRIPT, mode)
    assert found["built_first"] is False
    assert found["first"][PATCH]["state"] == "pending"
    assert found["after"]["state"] == "applied", found["after"]
    assert found["after"]["installed"] is True


def test_the_first_apply_all_records_what_the_engine_records_with_megatron_installed():
    code = ("import json, patchkit; print(json.dumps([s.to_dict() for s in {}]))")
    first = _run(code.format("patchkit.apply_all()"))
    engine = _run(code.format("patchkit.engine().apply_all()"))
    assert first == engine
    assert any(status["state"] == "pending" for status in first)
