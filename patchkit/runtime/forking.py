"""Fork safety: no child starts with a lock held by a thread that does not exist in it.

:func:`os.register_at_fork` runs :func:`_before_fork` in the forking thread: it takes the watch lock
(:mod:`.import_watch`) and then every guarded engine's lock, the only place those locks nest, so no
other thread is half-way through a change when the child's memory is copied. The parent releases
them in the reverse order. The child, where only the forking thread exists, gets fresh locks, and
each engine drops the install claims of threads that vanished (see :class:`Guarded`).
"""

from __future__ import annotations

import _thread  # `threading.get_ident` is this function; importing `threading` costs start-up a millisecond
import os
from _weakrefset import WeakSet  # `weakref.WeakSet` itself, without the import of `weakref`

from . import import_watch

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Protocol

    class Guarded(Protocol):
        """What an engine does around a fork: hold its lock, release it, renew its state in the child."""

        def _hold_for_fork(self) -> None: ...

        def _release_after_fork(self) -> None: ...

        def _renew_in_child(self, thread: int) -> None: ...


_GUARDED: WeakSet[Guarded] = WeakSet()


def guard(engine: Guarded) -> None:
    """Take ``engine``'s lock around every fork from now on, while it is alive."""
    _GUARDED.add(engine)


def _before_fork() -> None:
    import_watch.hold_for_fork()
    for engine in list(_GUARDED):
        engine._hold_for_fork()


def _after_fork_in_parent() -> None:
    for engine in list(_GUARDED):
        engine._release_after_fork()
    import_watch.release_after_fork()


def _after_fork_in_child() -> None:
    import_watch.renew_in_child()
    me = _thread.get_ident()
    for engine in list(_GUARDED):
        engine._renew_in_child(me)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
