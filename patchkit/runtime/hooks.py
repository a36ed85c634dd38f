"""Post-import hooks: call a function once a module has finished executing.

Why not ``wrapt.register_post_import_hook``: importing wrapt 2.x costs tens of milliseconds at
start-up (``wrapt.caching`` imports ``asyncio`` and ``ssl``), more than patchkit's whole budget,
and all the engine needs from it is this one function. What replaces it is one small meta-path
finder and one ``ModuleSpec`` subclass.

:func:`register` covers the three cases a hook can meet:

* the module is **already imported** (finished): the hook runs at once, in the caller's thread;
* the module is **being imported now** (in ``sys.modules``, ``__spec__._initializing`` true, in
  this thread or another): its spec is *armed*, see below, and the hook runs when that import ends;
* the module is **imported later**: the finder, first on ``sys.meta_path``, answers only for
  watched names, asks the other finders for the spec and arms it.

Arming a spec changes its class to :class:`_ArmedSpec`, a ``ModuleSpec`` subclass whose only
difference is a ``__setattr__``: ``importlib._bootstrap._load_unlocked`` (3.10-3.13) sets
``spec._initializing = False`` in a ``finally`` once the module's code has run, and that
assignment runs the hooks (then the spec's class is put back). The loader, the module and the spec
object are otherwise untouched, so nothing downstream sees a proxy. If the import failed (the module
is not in ``sys.modules`` then) the hooks stay registered for the next attempt, as wrapt's do. A
legacy loader without ``exec_module`` is wrapped instead, since that path never sets the flag.

Hooks run in the importing thread while it holds that module's import lock, exactly as wrapt's do;
an exception from a hook propagates into the ``import`` statement (the engine catches its own
unless strict mode asked for it to propagate).
"""

from __future__ import annotations

import _thread  # `threading`'s RLock and local are these classes; `import threading` costs start-up a millisecond
import sys
from importlib.machinery import ModuleSpec

from . import logs

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Sequence

    Hook = Callable[[ModuleType], None]

logger = logs.get(__name__)


_hooks: dict[str, list[Hook]] = {}
_lock = _thread.RLock()
_local = _thread._local()  # names this thread is resolving through the other finders


def initializing(module: object) -> bool:
    """Whether ``module`` is in the middle of its import (its code has not finished running).

    An armed import whose end was interrupted is settled here (see :func:`_settle`), so it does not
    count as in flight for ever.
    """
    spec = getattr(module, "__spec__", None)
    if not getattr(spec, "_initializing", False):
        return False
    return not (isinstance(spec, _ArmedSpec) and _settle(spec))


def _import_in_flight(name: str) -> bool:
    """Whether a thread still holds (or may hold) module ``name``'s import lock.

    Reads ``importlib._bootstrap._module_locks``, a private CPython detail (3.3 to 3.13): a module
    lock is created for an import and dropped with it, so no entry means no import in flight. If
    the detail is missing, the answer is "maybe" (True), which keeps the behaviour of waiting.
    """
    import importlib._bootstrap as bootstrap

    locks = getattr(bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return True
    ref = locks.get(name)
    return ref is not None and ref() is not None


def _settle(spec: "_ArmedSpec") -> bool:
    """Finish an armed import whose last step was interrupted; True if it was.

    The import machinery clears ``spec._initializing`` in a ``finally`` through our ``__setattr__``:
    a signal delivered as that Python call begins (before its first line) leaves the flag set and
    the hooks unrun, though the module's code has run and no thread imports it any more. Such a
    module would look mid-import for ever. If no import of it is in flight, clear the flag; its hooks
    run at the next :func:`register` for that name (not here: a caller may hold a lock that a hook
    must not be run under).
    """
    if _import_in_flight(spec.name):
        return False
    object.__setattr__(spec, "_initializing", False)
    object.__setattr__(spec, "__class__", ModuleSpec)
    return True


def register(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once module ``name`` has finished executing (see the module doc)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None or initializing(module):
            _hooks.setdefault(name, []).append(hook)
            _install()
            if module is not None:
                _arm(getattr(module, "__spec__", None), name)
            return
        leftover = _hooks.pop(name, [])  # of an import whose end was interrupted (see _settle)
    for waiting in (*leftover, hook):
        waiting(module)


def is_watched(name: str) -> bool:
    """Whether hooks are waiting for module ``name``."""
    return name in _hooks


def watched() -> list[str]:
    """The module names that still have hooks waiting (for status and tests)."""
    with _lock:
        return sorted(_hooks)


def _fire(name: str) -> None:
    module = sys.modules.get(name)
    if module is None or initializing(module):
        return  # the import failed (or is not over): keep the hooks for the next attempt
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


class _ArmedSpec(ModuleSpec):
    """A ``ModuleSpec`` that runs the hooks of its module when its import finishes."""

    def __setattr__(self, attribute: str, value: Any) -> None:
        object.__setattr__(self, attribute, value)
        if attribute == "_initializing" and not value:
            object.__setattr__(self, "__class__", ModuleSpec)
            _fire(self.name)


def _arm(spec: object, name: str) -> None:
    if type(spec) is ModuleSpec:
        spec.__class__ = _ArmedSpec
    elif isinstance(spec, _ArmedSpec):
        pass
    else:  # a foreign ModuleSpec subclass, or none: nothing to hook into; say so rather than hang
        logger.warning("patchkit: cannot watch the import of %s (spec %r); its hooks run on its next import",
                       name, type(spec).__name__)


class _LegacyLoader:
    """Wraps a loader that has only ``load_module`` (that path never clears ``_initializing``)."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def load_module(self, fullname: str) -> ModuleType:
        module: ModuleType = self._loader.load_module(fullname)
        _fire(fullname)
        return module

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._loader, attribute)


class _Finder:
    """First on ``sys.meta_path``; answers only for watched names, with the spec the others give."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _hooks:
            return None
        busy: set[str] = _local.__dict__.setdefault("busy", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                find_spec = getattr(finder, "find_spec", None)
                if finder is self or find_spec is None:
                    continue
                spec = find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            busy.discard(fullname)
        loader = getattr(spec, "loader", None)
        if loader is not None and not hasattr(loader, "exec_module") and hasattr(loader, "load_module"):
            spec.loader = _LegacyLoader(loader)
        else:
            _arm(spec, fullname)
        return spec

    def invalidate_caches(self) -> None:
        pass


_FINDER = _Finder()


def _install() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
