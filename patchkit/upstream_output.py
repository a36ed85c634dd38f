"""Keeping what upstreams print out of the doctor's report, without losing patchkit's own messages.

Importing megatron-core, ModelOpt or torch, and building their tiny models in the self-checks,
prints dozens of lines: ``warnings.warn`` at import, ``GPTModel IS DEPRECATED`` through logging's
last-resort handler, torch's own stream handlers, C++ output. :func:`captured` points file
descriptors 1 and 2 at a temporary file for the length of a block, so all of it (Python or C) lands
there, and hands back the text. What patchkit itself says in the block still reaches the user:
``PatchkitWarning`` (a config error that disables patches) is shown again after the block, once, and
the ``patchkit`` logger's records go to the report stream for the length of the block.

What the capture guarantees, whatever the block does:

* Nothing is left pointing at the capture once it ends. ``sys.stdout``/``sys.stderr`` are stand-ins
  (:class:`_Redirected`) that write to the temporary file during the block and to the real streams
  after it, so a logging handler, a thread or a module that kept them keeps working; handlers created
  during the block are repointed at the real streams. Their ``buffer`` follows the same switch, and
  their ``fileno()`` is 1 or 2 during the block (the descriptors that point at the file then), so a
  kept buffer or number reaches the real stream afterwards, never a closed file.
* Set-up and tear-down are atomic under signals. Both run with signals held
  (:func:`.runtime.interrupts.deferred`); during the block a Python signal handler that raises
  (Ctrl-C's ``KeyboardInterrupt``, a ``SystemExit`` from a SIGTERM handler) first ends the capture, so
  its traceback reaches the terminal and descriptors 1/2, the ``patchkit`` logger and the warning
  filters are back as they were, wherever the signal lands. A signal that lands in the middle of a
  write to the capture (the file chosen, the bytes not yet written: a finalizer the garbage collector
  runs there may be where the handler runs) waits for that write to finish and is raised again at its
  end: the write never finds the file closed, and the handler's exception propagates from the write
  instead of being dropped with the finalizer's.
* Another thread's output is kept: written to the file while the capture runs, to the real stream
  once it has ended, never to a closed file.
* A thread the block started and left running (a timed-out self-check) cannot write into standard
  output afterwards: its ``print`` goes to standard error, and so does anything written to descriptor
  1, while the main thread's writes to ``sys.stdout`` (a JSON report) still reach the real standard
  output.
  A later capture still takes what every other thread writes through that ``sys.stdout``.
* Without a writable temporary directory nothing is captured: one warning, and the block runs with
  its output going where it always goes.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; as in .runtime.interrupts
import functools
import io
import logging
import os
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, TypeVar, cast

from .runtime import interrupts

logger = logging.getLogger(__name__)

_Result = TypeVar("_Result")


@dataclass
class Captured:
    """What upstream code wrote to stdout/stderr during one block."""

    text: str = ""

    @property
    def lines(self) -> int:
        return len(self.text.splitlines())


def real_stderr() -> IO[str]:
    """A stream on a duplicate of file descriptor 2, unaffected by :func:`captured` (caller closes it)."""
    return os.fdopen(os.dup(2), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                     errors="replace")


def captured(report: IO[str]) -> _Capture:
    """Send fds 1 and 2 to a temporary file for the block; patchkit's own messages go to ``report``.

    Used as ``with captured(report) as upstream: ...``; ``upstream.text`` is filled when the block ends.
    """
    return _Capture(report)


class _MainThreadWrites:
    """The main thread's writes in progress through one capture's stand-ins, and the signals held until
    they finish.

    Python runs a signal handler in the main thread between two bytecodes, and those may be a
    finalizer's that the garbage collector runs in the middle of a write: after the stand-in chose the
    capture's file, before the text reached it. A handler that ended the capture there would close the
    file under that write, and, run by a finalizer, its exception (Ctrl-C's ``KeyboardInterrupt``) would
    be printed and dropped instead of raised. So the capture's handler holds a signal that lands inside
    such a write, and the write raises it again once it is done, where it propagates as from any other
    line. Only the main thread counts: no other thread runs signal handlers.
    """

    def __init__(self) -> None:
        self.depth = 0
        self.held: list[int] = []

    def deliver(self) -> None:
        """Raise each held signal again, once, now that no write is in progress (its handler runs here)."""
        held, self.held = dict.fromkeys(self.held), []
        for signum in held:
            _signal.raise_signal(signum)


class _Redirected(io.TextIOBase):
    """What ``sys.stdout``/``sys.stderr`` are during a capture, and stay for whoever kept them.

    Writes go to ``during`` (the capture file) until :meth:`end`, then to the real stream ``after``;
    a thread listed in ``left_behind`` writes to ``diverted`` instead of ``after``. A lock makes the
    switch and each write exclusive, so no other thread's write lands in a file being closed; the main
    thread's writes are counted in ``writes``, so that a signal landing in one waits for its end (see
    :class:`_MainThreadWrites`). Reentrant: a signal handler may still run in the middle of a write of
    the same thread (one the capture does not hold).
    """

    def __init__(self, during: IO[str], after: IO[str], writes: _MainThreadWrites | None = None,
                 descriptor: int | None = None) -> None:
        super().__init__()
        self._target, self._after, self._during = during, after, during
        #: The descriptor (1 or 2) pointed at ``during`` for the block: what :meth:`fileno` names then.
        self._descriptor = descriptor
        self._buffer = _RedirectedBuffer(self)
        self._lock = threading.RLock()
        self._writes = writes
        self.left_behind: frozenset[threading.Thread] = frozenset()
        self.diverted: IO[str] | None = None

    def _current(self) -> IO[str]:
        if self.diverted is not None and threading.current_thread() in self.left_behind:
            return self.diverted
        return self._target

    def end(self) -> None:
        """From now on, write to the real stream (``during`` is flushed first)."""
        with self._lock:
            try:
                self._target.flush()
            finally:
                self._target = self._after

    def send_to(self, stream: IO[str]) -> Callable[[], None]:
        """Write to ``stream`` until the returned step is called (a later capture's file)."""
        with self._lock:
            previous, self._target = self._target, stream

        def back() -> None:
            with self._lock:
                try:
                    self._target.flush()
                finally:
                    self._target = previous

        return back

    def _on_current(self, operation: Callable[[IO[str]], _Result]) -> _Result:
        """``operation`` on the stream writes go to now, exclusive of the switch; in the main thread,
        counted as a write in progress, and the signals held during it raised again at its end."""
        with self._lock:
            writes = self._writes
            if writes is None or threading.current_thread() is not threading.main_thread():
                return operation(self._current())
            writes.depth += 1
            try:
                return operation(self._current())
            finally:
                writes.depth -= 1
                if writes.held and not writes.depth:
                    writes.deliver()

    def write(self, text: str) -> int:
        return self._on_current(lambda stream: stream.write(text))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._on_current(lambda stream: stream.flush())

    def fileno(self) -> int:
        """During the block, the real descriptor (1 or 2), which points at the capture file until the
        block ends: a number kept past it names the real stream again, never a closed or reused one."""
        stream = self._current()
        if stream is self._during and self._descriptor is not None:
            return self._descriptor
        return stream.fileno()

    def isatty(self) -> bool:
        return self._current().isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._current(), "encoding", None) or "utf-8"

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._current(), "errors", None)

    @property
    def buffer(self) -> Any:
        """A binary stand-in that follows the same switch (code that kept it writes to the real stream
        after the block); missing, as on the stream itself, where the current stream has no buffer."""
        cast(Any, self._current()).buffer  # noqa: B018 - AttributeError where the stream has none
        return self._buffer

    def close(self) -> None:
        """Not closed by anyone who borrowed it: the real streams are not theirs to close."""


class _RedirectedBuffer(io.RawIOBase):
    """``buffer`` of a :class:`_Redirected`: bytes go where its text goes now, after the text written
    before them (the stream's pending text is flushed first)."""

    def __init__(self, text: _Redirected) -> None:
        super().__init__()
        self._text = text

    def write(self, data: Any) -> int:
        def write_bytes(stream: IO[str]) -> int:
            stream.flush()
            written = cast(Any, stream).buffer.write(data)
            return len(data) if written is None else written

        return self._text._on_current(write_bytes)

    def flush(self) -> None:
        self._text._on_current(lambda stream: (stream.flush(), cast(Any, stream).buffer.flush()))

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._text.fileno()

    def close(self) -> None:
        """Not closed by anyone who borrowed it, like the text stand-in."""


class _Capture:
    """One capture: the state it changed is a stack of undo steps, run once each whatever happens."""

    def __init__(self, report: IO[str]) -> None:
        self.report = report
        self.result = Captured()
        self._undo: list[Callable[[], None]] = []
        self._originals: interrupts.Handlers = {}
        self._writes = _MainThreadWrites()
        self._active = False
        #: fd 1 is restored as a copy of fd 2: the block left a thread running (see :meth:`_settle`).
        self._stdout_to_stderr = False

    def __enter__(self) -> Captured:
        try:
            with interrupts.deferred() as handlers:
                self._start()
                if self._active:
                    self._take_over(handlers)
        except BaseException:
            self._stop()
            raise
        return self.result

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop()

    # --- signals: the capture ends before a raising handler's exception propagates --------------

    def _take_over(self, handlers: interrupts.Handlers) -> None:
        """Each signal with a Python handler goes through :meth:`_on_signal` once the set-up ends."""
        for signum, handler in handlers.items():
            self._originals[signum] = handler
            handlers[signum] = self._on_signal

    def _give_back(self, handlers: interrupts.Handlers) -> None:
        """The original handlers return where the capture's is still in place (a handler someone set
        during the block stays theirs)."""
        for signum, handler in handlers.items():
            if handler == self._on_signal:
                handlers[signum] = self._originals[signum]

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._active and self._writes.depth:  # inside a write to the capture: raised again at its end
            self._writes.held.append(signum)
            return
        handler = self._originals[signum]
        if not self._active:  # a handler installed during the block kept ours: nothing to end any more
            handler(signum, frame)
            return
        try:
            handler(signum, frame)
        except BaseException:
            self._stop()
            raise

    # --- set-up and tear-down, each run with signals held ----------------------------------------

    def _start(self) -> None:
        from .runtime.errors import PatchkitWarning

        streams = (sys.stdout, sys.stderr)
        for stream in streams:
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed or broken stream: nothing to keep apart
                pass
        try:
            sink = tempfile.TemporaryFile()
        except OSError as exc:  # a read-only file system, no usable temporary directory
            logger.warning("patchkit: upstream output is not captured (no writable temporary directory: %s)",
                           exc)
            return
        self._undo.append(lambda: self._collect(sink, PatchkitWarning))
        catcher = warnings.catch_warnings(record=True)
        self._caught = catcher.__enter__()
        self._undo.append(lambda: catcher.__exit__(None, None, None))

        own_logger = logging.getLogger("patchkit")
        # patchkit's records go to the report for the block, whatever handlers the process has.
        handler = logging.StreamHandler(self.report)
        handler.setFormatter(logging.Formatter("%(message)s"))
        propagated = own_logger.propagate
        own_logger.addHandler(handler)
        self._undo.append(lambda: own_logger.removeHandler(handler))
        own_logger.propagate = False
        self._undo.append(lambda: setattr(own_logger, "propagate", propagated))

        threads_before = frozenset(threading.enumerate())
        saved: dict[int, int] = {}
        for fd in (1, 2):
            saved[fd] = os.dup(fd)
            self._undo.append(functools.partial(self._restore_fd, fd, saved))
        # Python-level writes too, when sys.stdout/sys.stderr are not the descriptors (a notebook, pytest).
        # Unbuffered: a signal handler that ends the capture in the middle of a write finds no buffer
        # busy ("reentrant call"), and nothing is left unwritten.
        text_sink = io.TextIOWrapper(io.FileIO(sink.fileno(), "w", closefd=False), encoding="utf-8",
                                     errors="replace", write_through=True)
        self._undo.append(text_sink.close)
        # A standard output kept away from a thread an earlier capture left running writes to a copy of
        # the real descriptor 1, which this capture's dup2 does not reach: it follows the capture itself.
        for router in list(_ROUTERS):
            self._undo.append(router.send_to(text_sink))
        redirected = (_Redirected(text_sink, streams[0], self._writes, descriptor=1),
                      _Redirected(text_sink, streams[1], self._writes, descriptor=2))
        self._undo.append(lambda: self._settle(redirected, streams, threads_before, saved))
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        sys.stdout, sys.stderr = redirected
        self._active = True

    def _stop(self) -> None:
        """Undo what :meth:`_start` did, each step once, with signals held; safe to call again."""
        with interrupts.deferred() as handlers:
            self._give_back(handlers)
            self._active = False
            while self._undo:
                step = self._undo.pop()
                try:
                    step()
                except Exception:  # noqa: BLE001 - the other steps must run; this one cannot be retried
                    logger.debug("patchkit: restoring after an upstream-output capture failed", exc_info=True)
        if not self._writes.depth:
            # A signal held by a write that ended as another signal ended the capture: not lost.
            self._writes.deliver()

    def _settle(self, redirected: tuple[_Redirected, _Redirected], streams: tuple[IO[str], IO[str]],
                threads_before: frozenset[threading.Thread], saved: dict[int, int]) -> None:
        """Point everything at the real streams again (the descriptors are restored after this step).

        A thread the block started and left running is kept away from standard output from now on:
        descriptor 1 is restored as a copy of descriptor 2 (what it writes there, C code included,
        lands on standard error), and ``sys.stdout`` becomes a stand-in that sends its writes to
        standard error and every other thread's to a stream on the real standard output.
        """
        left_behind = frozenset(t for t in threading.enumerate() if t not in threads_before and t.is_alive())
        stdout: Any = streams[0]
        if left_behind:
            stdout = _standard_output_without(left_behind, saved[1], streams)
            self._stdout_to_stderr = True
            for stand_in in redirected:
                stand_in.left_behind, stand_in.diverted = left_behind, streams[1]
        sys.stdout, sys.stderr = stdout, streams[1]
        for stand_in, real in zip(redirected, (stdout, streams[1]), strict=True):
            try:
                stand_in.end()
            finally:
                _repoint_handlers(stand_in, real)

    def _restore_fd(self, fd: int, saved: dict[int, int]) -> None:
        source = saved[fd]
        if fd == 1 and self._stdout_to_stderr:
            source = saved.get(2, 2)  # fd 2 itself once restored
        try:
            os.dup2(source, fd)
        finally:
            os.close(saved.pop(fd))

    def _collect(self, sink: IO[bytes], patchkit_warning: type[Warning]) -> None:
        """The block's text, and patchkit's own warnings shown once (the last step)."""
        try:
            sink.seek(0)
            printed = sink.read().decode("utf-8", errors="replace")
        finally:
            sink.close()
        upstream: list[str] = []
        reported: set[str] = set()
        for warning in getattr(self, "_caught", None) or ():
            shown = warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno,
                                           warning.line)
            if issubclass(warning.category, patchkit_warning):
                if str(warning.message) not in reported:  # the same config error, met by each apply
                    reported.add(str(warning.message))
                    self.report.write(shown)
            else:
                upstream.append(shown)
        self.result.text = "".join(upstream) + printed


def _repoint_handlers(stand_in: _Redirected, real: IO[str]) -> None:
    """Logging handlers created during the capture (they hold the stand-in) write to ``real`` now."""
    loggers: list[Any] = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for each in loggers:
        for handler in getattr(each, "handlers", ()):
            if isinstance(handler, logging.StreamHandler) and handler.stream is stand_in:
                handler.setStream(real)


#: Every ``sys.stdout`` made by :func:`_standard_output_without` still in use (a handler may hold one).
_ROUTERS: weakref.WeakSet[_Redirected] = weakref.WeakSet()


def _standard_output_without(left_behind: frozenset[threading.Thread], stdout_fd: int,
                             streams: tuple[IO[str], IO[str]]) -> _Redirected:
    """A ``sys.stdout`` on the real standard output (a copy of ``stdout_fd``) for every thread but
    ``left_behind``, whose writes go to standard error."""
    encoding = getattr(streams[0], "encoding", None) or "utf-8"
    kept = os.fdopen(os.dup(stdout_fd), "w", buffering=1, encoding=encoding, errors="replace")
    router = _Redirected(kept, kept)
    router.end()
    router.left_behind, router.diverted = left_behind, streams[1]
    _ROUTERS.add(router)
    return router
