"""Signals during a refit: held while patchkit changes the model, let through while the weights load.

A refit changes many tensors, loader attributes and ``torch.Tensor``'s write methods; a
``KeyboardInterrupt`` (or the exception a SIGTERM handler raises: ``SystemExit`` from ``sys.exit``)
between two of those changes would leave the model half-prepared, half-committed or
half-rolled-back. So for the length of one refit call a :class:`SignalWindow` replaces the handler
of every signal whose handler is a Python callable (the default SIGINT handler is; a framework's
SIGTERM, SIGHUP, SIGUSR1... handler may raise too; the synchronous faults are never held: see
:func:`patchkit.runtime.interrupts.held_signals`). A signal left at the OS default ends the process at
once, leaving nothing in it half-done:

- normally a signal is only noted. It reaches the handler that was in place at a
  :meth:`SignalWindow.safe_point` (where the refit can still roll back), or after the call, once
  the handlers are back and the model is consistent;
- inside :meth:`SignalWindow.interruptible` (the load phase: the caller's stream and vLLM's
  loaders, which may take long or hang) it reaches the previous handler at once. If that handler
  raises, the window first runs its ``on_interrupt`` callback (the refit's rollback, with further
  signals noted) and closes, then lets the exception through. The rollback thus never depends on
  the interrupted code's ``except``/``finally``/``__exit__`` running: a signal that lands while a
  ``with`` statement is exiting cannot skip it. A handler that returns (a flag a framework sets)
  interrupts nothing and the load goes on.

Python runs signal handlers in the main thread only, so elsewhere (and in a subinterpreter) a window
holds nothing: a refit in another thread is not interrupted by signals at all.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from patchkit.runtime.interrupts import held_signals

Handler = Callable[[int, "FrameType | None"], Any]
Pending = list[tuple[int, "FrameType | None"]]


class SignalWindow:
    """The signals noted during one refit call, and whether they may interrupt it right now."""

    def __init__(self, on_interrupt: Callable[[], None]) -> None:
        self._on_interrupt = on_interrupt
        self._previous: dict[int, Handler] = {}
        self._pending: Pending = []
        self._live = False
        self._closed = False

    def open(self) -> bool:
        """Install the window's handler (main thread only); False where signals are not ours to hold."""
        if threading.current_thread() is not threading.main_thread():
            return False
        try:
            for signum, previous in held_signals():
                self._previous[signum] = previous
                signal.signal(signum, self._handle)
        except ValueError:  # not the main interpreter
            self.close()
            return False
        except BaseException:  # a SIGTERM whose handler raised before its turn came: nothing held
            self.close()
            raise
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self._live:
            self._pending.append((signum, frame))
            return
        self._live = False  # from here on the refit rolls back: note what else arrives
        try:
            self._previous[signum](signum, frame)
        except BaseException:
            try:
                self._on_interrupt()
            finally:
                deliver(self.close())
            raise
        self._live = True  # the handler returned, raising nothing: nothing was interrupted

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Let signals through to their handlers while the block runs (those noted before first)."""
        self.safe_point()
        self._live = not self._closed
        try:
            yield
        finally:
            self._live = False

    def safe_point(self) -> None:
        """Deliver the signals noted so far; a handler's exception propagates from here.

        Call it only where the caller rolls back on an exception.
        """
        while self._pending:
            signum, frame = self._pending.pop(0)
            self._previous[signum](signum, frame)

    @property
    def closed(self) -> bool:
        """Whether the window has closed: after an interrupt, the refit call has been rolled back."""
        return self._closed

    def close(self) -> Pending:
        """Put the previous handlers back (unless someone replaced ours); what is left to deliver."""
        self._live = False
        self._closed = True
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
        pending, self._pending = self._pending, []
        return pending


def deliver(pending: Pending) -> None:
    """Each noted signal to the handler now in place, in order, even when one of them raises."""
    if not pending:
        return
    (signum, frame), rest = pending[0], pending[1:]
    try:
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, frame)
        elif handler == signal.SIG_DFL:
            signal.raise_signal(signum)
    finally:
        deliver(rest)
