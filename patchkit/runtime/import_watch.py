"""Import dispatch: tell every live engine when a module it waits for has finished importing.

Post-import hooks (:mod:`.hooks`) fire once and cannot be unregistered, so at most one is armed per
module name; it dispatches to whichever engines are alive (weakly held: an engine nobody uses is not
kept for its hooks), and each engine ignores modules it no longer waits for. A module whose import
is in flight (in any thread, this one included) is hooked too: the hook runs when that import
finishes.

Locks. ``_WATCH_LOCK`` guards which modules have a hook armed. It is never held together with an
engine lock: :func:`watch` is called after an engine's locked pass, and a dispatch takes each
engine's lock only after releasing it. The fork handlers (:mod:`.forking`) are the one place it
nests with them, taken first.
"""

from __future__ import annotations

import _thread  # `threading.RLock` is this class; importing `threading` costs start-up a millisecond
import sys
from _weakrefset import WeakSet  # `weakref.WeakSet` itself, without the import of `weakref`

from . import logs

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Any, Iterable, Protocol

    class Listener(Protocol):
        """What dispatch needs of an engine: to be told of an import, and whether it is strict."""

        _strict: bool

        def _module_imported(self, module: str) -> None: ...


logger = logs.get("patchkit")


_LISTENERS: WeakSet[Listener] = WeakSet()
_ARMED: set[str] = set()
_WATCH_LOCK = _thread.RLock()


def listen(listener: Listener) -> None:
    """Have ``listener`` told of every watched module's import from now on, while it is alive."""
    _LISTENERS.add(listener)


def forget(listener: Listener) -> None:
    """Tell ``listener`` of no further import (the start-up pass's, once the engine hears them itself)."""
    _LISTENERS.discard(listener)


def imported(module: str) -> bool:
    """In ``sys.modules`` and done executing. A module that imports another target module is in
    ``sys.modules`` while it still runs: installing then would find its attributes missing."""
    found = sys.modules.get(module)
    if found is None or not getattr(getattr(found, "__spec__", None), "_initializing", False):
        return found is not None
    from . import hooks  # only for a module flagged as importing: hooks settles one whose end was interrupted, logs

    return not hooks.initializing(found)


def watch(modules: Iterable[str]) -> None:
    """Dispatch each of ``modules`` once it has finished importing: now if it has, when its import in
    flight completes, or at its first import. Each is looked at once (patches of a family wait for the
    same modules), all of them under one hold of the watch lock: start-up arms a hook for every module
    its patches wait for. Never called with an engine lock held."""
    from . import hooks

    finished, waiting = [], []
    with _WATCH_LOCK:
        for module in dict.fromkeys(modules):
            # Armed and still registered: nothing to do. (_ARMED alone can be stale when an interruption
            # came between noting a module here and registering its hook.)
            if module in _ARMED and hooks.is_watched(module):
                continue
            if imported(module):
                finished.append(module)
            else:
                _ARMED.add(module)
                waiting.append(module)
    for module in finished:
        _dispatch(module)
    for module in waiting:
        hooks.register(module, _on_import)  # runs it at once if the import finished meanwhile
        if imported(module):
            # The import in flight ended between our look and the hook's arming: it will not fire.
            # Dispatching twice is harmless (an engine ignores modules it no longer waits for).
            _on_import(sys.modules[module])


def _on_import(module: Any) -> None:
    with _WATCH_LOCK:
        _ARMED.discard(module.__name__)
    _dispatch(module.__name__)


def _dispatch(module: str) -> None:
    """Never let a patch break the user's import, unless strict mode asked for exactly that."""
    for listener in list(_LISTENERS):
        try:
            listener._module_imported(module)
        except Exception:
            if listener._strict:
                raise
            logger.exception("patchkit: post-import hook for %s failed", module)


# -- fork (called by .forking, in this order relative to the engines' locks) -----------------------


def hold_for_fork() -> None:
    _WATCH_LOCK.acquire()


def release_after_fork() -> None:
    _WATCH_LOCK.release()


def renew_in_child() -> None:
    """Fresh locks in a forked child: a thread that held one does not exist there."""
    global _WATCH_LOCK
    _WATCH_LOCK = _thread.RLock()
    hooks: Any = sys.modules.get(f"{__package__}.hooks")
    if hooks is not None:  # the hook registry's lock, held briefly by register() in any thread
        hooks._lock = _thread.RLock()
