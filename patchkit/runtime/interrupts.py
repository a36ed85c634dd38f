"""Holding SIGINT and SIGTERM over the engine's short critical sections.

A state change of the engine (setting a patch's attributes and recording it, restoring them and
recording that) must not stop half-way. Two mechanisms make it so:

* every section is written to be rolled back or finished when *any* exception arrives in it (a
  ``KeyboardInterrupt`` included): see :mod:`.engine` and :mod:`.installer`;
* the rollback or completion code itself, and the few lines that set attributes, run inside
  :func:`deferred`, so a second Ctrl-C (or a SIGTERM whose handler raises or calls ``sys.exit``)
  cannot interrupt the code that repairs the first one.

:func:`deferred` replaces the Python-level handlers of SIGINT and SIGTERM with one that only notes
the signal, and on exit puts the handlers back and raises each noted signal again, so the original
handler runs right after the section, exactly once per signal. Python runs signal handlers only in
the main thread, so in any other thread there is nothing to hold and the section costs nothing. A
handler that is not a Python callable (``SIG_DFL``: the process is killed; ``SIG_IGN``) is left
alone. ``_signal`` (built in, already loaded by every interpreter) is used rather than ``signal``,
which would add an import at start-up.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; the `signal` wrapper would cost an import at start-up
import contextlib
import threading
from typing import Any, Iterator

#: The signals whose Python handlers are held: Ctrl-C, and the usual "please stop" of job schedulers.
HELD = (_signal.SIGINT, _signal.SIGTERM)

@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM (in the main thread) until the block is done, then deliver them."""
    if threading.current_thread() is not threading.main_thread():  # (a forked child has a new main thread)
        yield
        return
    received: list[int] = []

    def note(signum: int, frame: Any) -> None:
        received.append(signum)

    previous: list[tuple[int, Any]] = []
    try:
        for signum in HELD:
            handler = _signal.getsignal(signum)
            if callable(handler):
                previous.append((signum, handler))
                _signal.signal(signum, note)
        yield
    finally:
        for signum, handler in reversed(previous):
            _signal.signal(signum, handler)
        for signum in dict.fromkeys(received):
            _signal.raise_signal(signum)
