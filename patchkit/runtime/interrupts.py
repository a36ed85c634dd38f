"""Holding signals over the engine's short critical sections.

A state change of the engine (setting a patch's attributes and recording it, restoring them and
recording that) must not stop half-way. Two mechanisms make it so:

* every section is written to be rolled back or finished when *any* exception arrives in it (a
  ``KeyboardInterrupt`` included): see :mod:`.engine` and :mod:`.installer`;
* the rollback or completion code itself, and the few lines that set attributes, run inside
  :func:`deferred`, so a second Ctrl-C (or a SIGTERM whose handler raises or calls ``sys.exit``)
  cannot interrupt the code that repairs the first one.

:func:`deferred` replaces the Python-level handler of *every* signal that has one (a callable:
SIGINT's default handler, a framework's SIGTERM/SIGHUP/SIGUSR1/SIGQUIT/SIGALRM handler that raises or
calls ``sys.exit``; see :func:`held_signals`) with one that only notes the signal, and on exit puts
the handlers back and raises each noted signal again, so the original handler runs right after the
section, exactly once per signal. Any Python handler may raise, so none is let run in the middle of
a section. Not held: the synchronous faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL, and SIGABRT, which
``abort()`` raises from C): the faulting code would run again if the handler returned, so they cannot
wait. Python runs signal handlers only in the main thread, so in any other thread there is nothing
to hold and the section costs nothing. A handler that is not a Python callable (``SIG_DFL``: the
process is killed, which leaves nothing half-done in it; ``SIG_IGN``) is left alone. ``_signal``
(built in, already loaded by every interpreter) is used rather than ``signal``, which would add an
import at start-up.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the `signal` wrapper would cost an import at start-up
import contextlib
import threading

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Any, Callable, Iterator

    #: What :func:`deferred` yields: each held signal and the handler it puts back when the section ends.
    Handlers = dict[int, Callable[[int, Any], Any]]

#: Synchronous faults: a handler for them cannot wait (the faulting instruction would run again).
NEVER_HELD = frozenset(getattr(_signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
                       if hasattr(_signal, name))


def held_signals() -> list[tuple[int, Any]]:
    """Each signal that has a Python handler now (a callable), with that handler, faults excepted:
    what a critical section holds."""
    found = []
    for signum in sorted(_signal.valid_signals()):
        if signum in NEVER_HELD:
            continue
        try:
            handler = _signal.getsignal(signum)
        except (OSError, ValueError):  # a signal number the platform lists but cannot query
            continue
        if callable(handler):
            found.append((signum, handler))
    return found


@contextlib.contextmanager
def deferred() -> Iterator[Handlers]:
    """Hold every signal with a Python handler (in the main thread) until the block is done, then
    deliver them.

    Yields each held signal with the handler put back at the end: a section that installs a state
    which must outlive it *and* be undone before a signal's exception propagates (the upstream-output
    capture's redirected descriptors) replaces entries there, so its own handler takes over atomically
    with the section's end. Empty in any other thread than the main one.
    """
    if threading.current_thread() is not threading.main_thread():  # (a forked child has a new main thread)
        yield {}
        return
    received: list[int] = []

    def note(signum: int, frame: Any) -> None:
        received.append(signum)

    restore: Handlers = {}
    try:
        for signum, handler in held_signals():
            restore[signum] = handler
            _signal.signal(signum, note)
        yield restore
    finally:
        for signum, handler in reversed(restore.items()):
            # Only where the section's own handler is still in place: a signal that arrived before the
            # hold began may have run code that already restored (or changed) this one.
            if _signal.getsignal(signum) is note:
                _signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            _signal.raise_signal(signum)
