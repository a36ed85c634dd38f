"""Threads, imports and forks racing the engine: real threads, a real ``os.fork``, real subprocesses.

Each race is made deterministic with events the toy modules wait on, so the interleaving the test
names is the one that runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

from patchkit import Patch, Replace, State, Variant


def forward(self, x):
    return "patched forward"


SLOW_CORE = '''
from . import sync

sync.started.set()
sync.release.wait(20)  # the test applies patches while this import is in flight


class Model:
    def forward(self, x):
        return x + 1
'''

SYNC = '''
import threading

started = threading.Event()
release = threading.Event()
during_import = None  # set by a test: called at the end of core's body, while core is still importing
'''

CALLING_CORE = '''
from . import sync


class Model:
    def forward(self, x):
        return x + 1


sync.during_import()
'''


def _toy_patch(up) -> Patch:
    action = Replace(up.target("Model.forward"), forward)
    return Patch(id="toy.forward", summary="s", why="w", upstream="u", removal="r",
                 variants=(Variant(requires={up.name: ">=1"}, installs=(action,)),))


def _rewrite(up, core: str) -> None:
    (up.root / up.package / "sync.py").write_text(SYNC)
    (up.root / up.package / "core.py").write_text(core)


def test_apply_all_while_another_thread_imports_the_target_ends_applied(engine, make_upstream):
    up = make_upstream()
    _rewrite(up, SLOW_CORE)
    engine.register(_toy_patch(up))
    sync = __import__(f"{up.package}.sync", fromlist=["x"])
    importer = threading.Thread(target=up.import_core)
    importer.start()
    assert sync.started.wait(20)
    (record,) = engine.apply_all()  # the import is in flight: nothing to install into yet
    assert record.state is State.PENDING
    sync.release.set()
    importer.join(20)
    assert not importer.is_alive()
    (record,) = engine.status()
    assert record.state is State.APPLIED, record
    assert up.import_core().Model().forward(1) == "patched forward"


def test_apply_all_called_from_inside_the_targets_own_import_ends_applied(engine, make_upstream):
    up = make_upstream()
    _rewrite(up, CALLING_CORE)
    engine.register(_toy_patch(up))
    sync = __import__(f"{up.package}.sync", fromlist=["x"])
    seen = []
    sync.during_import = lambda: seen.extend(engine.apply_all())
    core = up.import_core()
    assert [r.state for r in seen] == [State.PENDING]  # core had not finished when apply_all ran
    (record,) = engine.status()
    assert record.state is State.APPLIED, record
    assert core.Model().forward(1) == "patched forward"


def test_an_in_flight_import_that_fails_leaves_the_patch_waiting_for_the_next_attempt(engine, make_upstream):
    up = make_upstream()
    _rewrite(up, CALLING_CORE + "\nraise RuntimeError('core fails to import this time')\n")
    engine.register(_toy_patch(up))
    sync = __import__(f"{up.package}.sync", fromlist=["x"])
    sync.during_import = engine.apply_all
    try:
        up.import_core()
    except RuntimeError:
        pass
    assert engine.status()[0].state is State.PENDING
    (up.root / up.package / "core.py").write_text(CALLING_CORE)
    sync.during_import = lambda: None
    sys.modules.pop(up.core, None)
    import importlib

    importlib.invalidate_caches()
    core = up.import_core()
    assert engine.status()[0].state is State.APPLIED
    assert core.Model().forward(1) == "patched forward"


DEADLOCK_SCRIPT = '''
import json, os, sys, threading
sys.path.insert(0, {root!r})
import patchkit
from patchkit import Patch, Replace, Variant, Wrap

eng = patchkit.Engine()
eng.register(Patch(id="toy.a", summary="s", why="w", upstream="u", removal="r", variants=(
    Variant(requires={{{dist!r}: ">=1"}}, installs=(
        Wrap("{pkg}.core:Model.backward", "{pkg}._signal:factory"),
        Replace("{pkg}.core:Model.forward", "{pkg}._impl:forward"),
    )),
)))
eng.register(Patch(id="toy.b", summary="s", why="w", upstream="u", removal="r", variants=(
    Variant(requires={{{dist!r}: ">=1"}}, installs=(Replace("{pkg}.core2:compute", "{pkg}._signal:compute"),)),
)))
eng.apply_all()
from {pkg} import sync

def import_impl():
    import {pkg}._impl

def import_core():
    sync.impl_started.wait(20)
    import {pkg}.core

threads = [threading.Thread(target=import_impl, daemon=True), threading.Thread(target=import_core, daemon=True)]
for t in threads:
    t.start()
for t in threads:
    t.join(20)
alive = [t.is_alive() for t in threads]
if any(alive):  # deadlocked: importing core here would wait for ever too
    sys.stdout.write(json.dumps({{"alive": alive}}))
    sys.stdout.flush()
    os._exit(0)
from {pkg}.core import Model
sys.stdout.write(json.dumps({{"alive": alive, "states": [r.state.value for r in eng.status()],
                              "forward": Model().forward(1)}}))
sys.stdout.flush()
os._exit(0)
'''

DEADLOCK_FILES = {
    "sync.py": "import threading\nimpl_started = threading.Event()\nin_engine = threading.Event()\n",
    "core2.py": "def compute(x):\n    return x\n",
    "_signal.py": textwrap.dedent('''
        from . import sync


        def factory(original):
            sync.in_engine.set()  # the engine is installing toy.a, on the thread importing core
            return original


        def compute(x):
            return "patched compute"
    '''),
    "_impl.py": textwrap.dedent('''
        from . import sync

        sync.impl_started.set()
        sync.in_engine.wait(3)  # let the other thread's hook start installing toy.a
        from . import core2  # a target of toy.b: its hook needs the engine


        def forward(self, x):
            return "patched forward"
    '''),
}


def test_two_threads_importing_one_through_an_implementation_module_do_not_deadlock(make_upstream):
    # Thread 1 imports _impl (holding its import lock), which imports core2, whose hook needs the
    # engine. Thread 2 imports core; its hook installs toy.a, which imports _impl. Holding the
    # engine lock across that import deadlocks the two threads.
    up = make_upstream()
    for name, text in DEADLOCK_FILES.items():
        (up.root / up.package / name).write_text(text)
    script = DEADLOCK_SCRIPT.format(root=str(up.root), dist=up.name, pkg=up.package)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"alive": [False, False], "states": ["applied", "applied"], "forward": "patched forward"}


FORK_SCRIPT = '''
import os, signal, sys, threading, time
import patchkit

eng = patchkit.engine()
held = threading.Event()

def hold_the_lock():
    with eng._lock:
        held.set()
        time.sleep(1.0)

threading.Thread(target=hold_the_lock, daemon=True).start()
held.wait(10)
pid = os.fork()
if pid == 0:
    signal.alarm(15)  # a child that hangs dies of SIGALRM instead of hanging the test
    patchkit.status()
    patchkit.apply_all()
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
'''


def test_fork_while_another_thread_holds_the_engine_lock_gives_a_working_child():
    result = subprocess.run([sys.executable, "-c", FORK_SCRIPT], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", result.stdout  # -14 (SIGALRM) when the child hung


def test_a_forked_child_has_the_parents_state_and_can_revert_and_apply(engine, make_upstream):
    up = make_upstream()
    engine.register(_toy_patch(up))
    engine.apply_all()
    read, write = os.pipe()
    core = up.import_core()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            (record,) = engine.status()
            engine.revert_all()
            engine.apply_all()
            os.write(write, json.dumps([record.state.value, core.Model().forward(1)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert json.loads(os.read(read, 4096)) == ["applied", "patched forward"]
    os.close(read)
