"""Post-import hooks (patchkit.runtime.hooks): later, already-imported and in-flight imports, failures."""

from __future__ import annotations

import importlib
import sys
import threading
import time

import pytest

from patchkit.runtime import hooks


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh top-level package name whose modules the test writes."""
    name = f"hooktoy{time.monotonic_ns()}"
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / name, name
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def _record(seen):
    return lambda module: seen.append((module.__name__, getattr(module, "DONE", None)))


def test_a_hook_runs_after_a_later_import_has_executed_the_module(package) -> None:
    folder, name = package
    (folder / "later.py").write_text("DONE = 'all of it'\n")
    seen: list = []
    hooks.register(f"{name}.later", _record(seen))
    assert seen == []
    module = importlib.import_module(f"{name}.later")
    assert seen == [(f"{name}.later", "all of it")]
    assert type(module.__spec__).__name__ == "ModuleSpec"  # the armed class is put back
    importlib.reload(module)
    assert len(seen) == 1  # once


def test_an_already_imported_module_runs_the_hook_at_once(package) -> None:
    folder, name = package
    (folder / "done.py").write_text("DONE = 1\n")
    importlib.import_module(f"{name}.done")
    seen: list = []
    hooks.register(f"{name}.done", _record(seen))
    assert seen == [(f"{name}.done", 1)]


def test_a_module_registering_its_own_hook_mid_import_gets_it_at_the_end(package) -> None:
    folder, name = package
    (folder / "selfish.py").write_text(
        "import sys\nfrom patchkit.runtime import hooks\n"
        "SEEN = []\n"
        "hooks.register(__name__, lambda m: SEEN.append(getattr(m, 'DONE', None)))\n"
        "assert SEEN == []\n"
        "DONE = 'finished'\n")
    module = importlib.import_module(f"{name}.selfish")
    assert module.SEEN == ["finished"]


def test_an_import_in_flight_in_another_thread_runs_the_hook_when_it_ends(package) -> None:
    folder, name = package
    (folder / "slow.py").write_text(
        "import threading\nSTARTED = threading.Event()\nRELEASE = threading.Event()\n"
        "import builtins\nbuiltins._hooktoy_slow = (STARTED, RELEASE)\n"
        "STARTED.set()\nRELEASE.wait(10)\nDONE = 'late'\n")
    seen: list = []
    importer = threading.Thread(target=importlib.import_module, args=(f"{name}.slow",))
    importer.start()
    import builtins

    for _ in range(1000):
        if hasattr(builtins, "_hooktoy_slow"):
            break
        time.sleep(0.01)
    started, release = builtins._hooktoy_slow
    assert started.wait(10)
    hooks.register(f"{name}.slow", _record(seen))
    assert seen == []  # still running
    release.set()
    importer.join(10)
    del builtins._hooktoy_slow
    assert seen == [(f"{name}.slow", "late")]


def test_a_failed_import_keeps_the_hook_for_the_next_attempt(package) -> None:
    folder, name = package
    (folder / "flaky.py").write_text("raise RuntimeError('not yet')\n")
    seen: list = []
    hooks.register(f"{name}.flaky", _record(seen))
    with pytest.raises(RuntimeError):
        importlib.import_module(f"{name}.flaky")
    assert seen == [] and f"{name}.flaky" in hooks.watched()
    (folder / "flaky.py").write_text("DONE = 'second try'\n")
    importlib.invalidate_caches()
    sys.modules.pop(f"{name}.flaky", None)
    import os

    os.utime(folder / "flaky.py", ns=(time.time_ns(), time.time_ns() + 10**9))
    importlib.import_module(f"{name}.flaky")
    assert seen == [(f"{name}.flaky", "second try")]


def test_engine_patch_installs_on_import_without_wrapt(make_upstream, engine) -> None:
    from patchkit import Patch, Replace, State, Variant

    up = make_upstream("1.0")
    engine.register(Patch(id="toy.hooked", summary="s", why="w", upstream="u", removal="r",
                          variants=(Variant({up.name: ">=1"}, (Replace(up.target("Model.forward"), len),)),)))
    (pending,) = engine.apply_all()
    assert pending.state is State.PENDING
    core = up.import_core()
    assert core.Model.__dict__["forward"] is len
    assert "wrapt" not in sys.modules or "wrapt" in _preloaded
    assert engine.status()[0].state is State.APPLIED


_preloaded = set(sys.modules)


def test_patches_as_they_were_cancels_a_patch_left_waiting_for_an_import(make_upstream, engine) -> None:
    """A doctor run in a test leaves patches of not-yet-imported modules pending: a later test's import
    must not install them."""
    from patchkit import Patch, Replace, State, Variant
    from patchkit.selfcheck import patches_as_they_were

    up = make_upstream("1.0")
    engine.register(Patch(id="toy.waiting", summary="s", why="w", upstream="u", removal="r",
                          variants=(Variant({up.name: ">=1"}, (Replace(up.target("Model.forward"), len),)),)))
    with patches_as_they_were(engine):
        (pending,) = engine.apply_all()
        assert pending.state is State.PENDING
    core = up.import_core()
    assert core.Model.__dict__["forward"] is not len
    assert engine.status()[0].state is State.REVERTED
