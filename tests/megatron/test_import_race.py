"""A patch target imported in another thread while ``apply_all()`` runs: the real upstream.

``megatron.core.transformer.moe.token_dispatcher`` is held mid-import (a meta-path finder pauses
the first import its body makes) while the main thread calls ``patchkit.apply_all()``: the
all-to-all patch meets a module that is in ``sys.modules`` but still executing. The end state
must be the same as either clean order: applied, and upstream's class patched. Runs in a fresh
interpreter, so that megatron-core is imported there for the first time.
"""

from __future__ import annotations

import textwrap

import pytest
from fresh_process import last_printed

pytest.importorskip("megatron.core")

RACE = textwrap.dedent('''
    import importlib, importlib.abc, json, sys, threading
    import patchkit

    TD = "megatron.core.transformer.moe.token_dispatcher"
    PATCH = "megatron.moe_alltoall_replay_token_count"
    paused = threading.Event()


    class PauseInsideTheImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            module = sys.modules.get(TD)
            if module is not None and getattr(module.__spec__, "_initializing", False) and not paused.is_set():
                paused.set()
                threading.Event().wait(15)  # long enough for apply_all() to meet the import in flight
            return None


    sys.meta_path.insert(0, PauseInsideTheImport())
    importer = threading.Thread(target=importlib.import_module, args=(TD,), daemon=True)
    importer.start()
    assert paused.wait(600), "token_dispatcher never paused mid-import"
    in_flight = getattr(sys.modules[TD].__spec__, "_initializing", False)
    patchkit.apply_all()
    importer.join(600)
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as Dispatcher

    record = patchkit.status(PATCH)[0]
    patched = Dispatcher.preprocess
    patchkit.revert(PATCH)
    sys.stdout.write(json.dumps({"in_flight": in_flight, "state": record.state.value, "error": record.error,
                                 "installed": patched is not Dispatcher.preprocess}))
''')


@pytest.mark.slow
def test_token_dispatcher_imported_in_another_thread_during_apply_all_ends_applied():
    seen = last_printed(RACE, without=("PATCHKIT_",), timeout=900, options=("-W", "ignore"), check=True)
    assert seen == {"in_flight": True, "state": "applied", "error": None, "installed": True}
