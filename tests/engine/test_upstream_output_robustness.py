"""The upstream-output capture never loses or misroutes a line, whatever happens around it.

* a logger an upstream configures during the capture writes to the real streams after it (no
  ``Logging error ... I/O operation on closed file``);
* Ctrl-C at any point of the capture's set-up, block or tear-down leaves descriptors 1/2,
  ``sys.stdout``/``sys.stderr``, the ``patchkit`` logger, the warning filters and the signal
  handlers as they were, and the ``KeyboardInterrupt`` reaches the real stderr;
* Ctrl-C whose handler a finalizer runs in the middle of a write (the capture file chosen, the text
  not yet written) is raised at the write's end, and the write lands in the file;
* another thread printing across many captures loses no line and never writes to a closed file;
* a ``sys.stdout.buffer`` or ``fileno()`` kept from inside the capture writes to the real stream after it;
* no writable temporary directory: nothing captured, one warning, no crash (``patchkit status`` too);
* a timed-out self-check that keeps printing cannot write into ``patchkit doctor --json``'s stdout;
* after a capture that left a thread running, later captures still take what a kept logger writes.
"""

from __future__ import annotations

import _signal
import io
import json
import linecache
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest

import patchkit.runtime.interrupts as interrupts_module
import patchkit.upstream_output as upstream_output_module
from patchkit.upstream_output import captured

SWEPT = (upstream_output_module.__file__, interrupts_module.__file__)


def test_a_logger_configured_during_the_capture_writes_to_the_real_streams_after_it(capfd):
    chatty = logging.getLogger("toy_upstream_logger_configured_in_capture")
    try:
        with captured(io.StringIO()) as upstream:
            for stream in (sys.stdout, sys.stderr):  # as vLLM's init_logger and torch do at import
                chatty.addHandler(logging.StreamHandler(stream))
            chatty.warning("said during the capture")
        chatty.warning("said after the capture")
        for handler in chatty.handlers:
            handler.flush()
    finally:
        for handler in list(chatty.handlers):
            chatty.removeHandler(handler)
    out, err = capfd.readouterr()
    assert upstream.text.count("said during the capture") == 2
    assert "Logging error" not in out + err and "closed file" not in out + err, err
    assert out == "said after the capture\n" and err == "said after the capture\n"
    assert all(handler.stream in (sys.stdout, sys.stderr) for handler in chatty.handlers) or not chatty.handlers


# --- signals at every point ---------------------------------------------------------------------


def state_of_the_process() -> dict[str, Any]:
    """Everything a capture changes, as comparable values."""
    own = logging.getLogger("patchkit")
    return {"fd1": os.fstat(1)[:2] + (os.fstat(1).st_ino,), "fd2": os.fstat(2)[:2] + (os.fstat(2).st_ino,),
            "stdout": sys.stdout, "stderr": sys.stderr, "handlers": list(own.handlers),
            "propagate": own.propagate, "showwarning": warnings.showwarning, "filters": list(warnings.filters),
            "sigint": _signal.getsignal(_signal.SIGINT)}


def capture_once() -> None:
    with captured(io.StringIO()):
        print("inside")
        os.write(1, b"inside, at the descriptor\n")


class DeliverSigint:
    """A trace function that delivers SIGINT at one line event of the swept files, as the interpreter
    would there: it calls the handler in place at that moment (patchkit's note while signals are held,
    the default handler, raising ``KeyboardInterrupt``, otherwise)."""

    def __init__(self, at: int | None) -> None:
        self.at, self.count, self.seen = at, 0, set()

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and not frame.f_code.co_filename.startswith(SWEPT):
            return None
        if event == "line":
            key = (frame, frame.f_lineno)
            if key in self.seen and linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip().startswith(
                    "with "):
                return self  # the block's end reported on the `with` line: no signal is delivered there
            self.seen.add(key)
            self.count += 1
            if self.count == self.at:
                handler = _signal.getsignal(_signal.SIGINT)
                handler(_signal.SIGINT, frame)
        return self


def traced(tracer: DeliverSigint, operation: Callable[[], None]) -> BaseException | None:
    sys.settrace(tracer)
    try:
        operation()
    except KeyboardInterrupt as exc:
        return exc
    finally:
        sys.settrace(None)
    return None


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises ``KeyboardInterrupt``, as in an interactive process (a background job starts with it ignored)."""
    previous = _signal.signal(_signal.SIGINT, _signal.default_int_handler)
    yield
    _signal.signal(_signal.SIGINT, previous)


@pytest.mark.skipif(sys.gettrace() is not None, reason="the sweep needs the trace hook to itself")
def test_sigint_at_every_line_of_a_capture_restores_the_descriptors_and_the_logger(capfd, ctrl_c_raises):
    capfd.readouterr()
    before = state_of_the_process()
    counter = DeliverSigint(None)
    traced(counter, capture_once)
    assert counter.count > 50
    broken = []
    for at in range(1, counter.count + 1):
        raised = traced(DeliverSigint(at), capture_once)
        # The descriptors are back: what is written now reaches the real (test-captured) stdout.
        os.write(1, b"after\n")
        out = capfd.readouterr().out
        after = state_of_the_process()
        changed = sorted(key for key in before if before[key] != after[key])
        if changed or not out.endswith("after\n"):
            broken.append((at, raised is not None, changed, out[-80:]))
            for key in ("handlers",):  # repair, so the next point starts clean
                logging.getLogger("patchkit").handlers[:] = before[key]
            logging.getLogger("patchkit").propagate = before["propagate"]
            sys.stdout, sys.stderr = before["stdout"], before["stderr"]
            _signal.signal(_signal.SIGINT, before["sigint"])
    assert not broken, f"{len(broken)} of {counter.count} points left state behind: {broken[:5]}"


class RunsTheSigintHandler:
    """An object whose finalizer runs the SIGINT handler in place, as a signal landing while the garbage
    collector finalizes an object runs it there (what a finalizer raises, Python prints and drops)."""

    def __del__(self) -> None:
        _signal.getsignal(_signal.SIGINT)(_signal.SIGINT, None)


class FinalizeOnceTheFileIsChosen:
    """A trace function: when a stand-in's ``_current()`` returns (the capture file chosen, nothing
    written yet), a finalizer that runs the SIGINT handler runs there, once. The sweep above can meet
    this by chance: an earlier capture's stand-in, kept in a reference cycle, is freed by the garbage
    collector during a later capture, and its ``close`` runs lines of the swept file."""

    def __init__(self) -> None:
        self.chosen: list[Any] = []

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "call" and frame.f_code is upstream_output_module._Redirected._current.__code__:
            return self.on_return
        return None

    def on_return(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "return" and not self.chosen:
            self.chosen.append(arg)
            RunsTheSigintHandler()  # dropped at once: its finalizer runs now
        return self.on_return


@pytest.mark.skipif(sys.gettrace() is not None, reason="the test needs the trace hook to itself")
def test_ctrl_c_run_by_a_finalizer_between_choosing_the_capture_file_and_writing_is_raised_after_the_write(
        capfd, ctrl_c_raises, monkeypatch):
    capfd.readouterr()
    before = state_of_the_process()
    dropped: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)
    hook = FinalizeOnceTheFileIsChosen()
    with pytest.raises(KeyboardInterrupt):
        with captured(io.StringIO()) as upstream:
            sys.settrace(hook)
            try:
                print("inside")
            finally:
                sys.settrace(None)
    os.write(1, b"after\n")
    out = capfd.readouterr().out
    assert hook.chosen and hook.chosen[0] is not before["stdout"], "the finalizer did not run mid-write"
    assert not dropped, f"a finalizer dropped the handler's exception: {dropped[0].exc_value!r}"
    assert upstream.text.startswith("inside"), upstream.text  # the write landed in the capture file
    assert out == "after\n"
    assert state_of_the_process() == before


SIGINT_IN_A_CHILD = r"""
import os, sys, io, _signal, logging
from patchkit.upstream_output import captured

_signal.signal(_signal.SIGINT, _signal.default_int_handler)  # also when started as a background job
own = logging.getLogger("patchkit")
handlers = list(own.handlers)
fd1 = os.fstat(1).st_ino
delay = float(sys.argv[1])
interrupted = 0
_signal.signal(_signal.SIGALRM, lambda *_: _signal.raise_signal(_signal.SIGINT))
for run in range(int(sys.argv[2])):
    try:
        try:
            _signal.setitimer(_signal.ITIMER_REAL, delay * (1 + run % 40))
            for _ in range(20):
                with captured(io.StringIO()):
                    print("inside")
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
    except KeyboardInterrupt:
        interrupted += 1
    assert os.fstat(1).st_ino == fd1, f"run {run}: fd 1 left on the capture file"
    assert sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__, f"run {run}: sys streams left"
    assert own.handlers == handlers and own.propagate is True, f"run {run}: {own.handlers} {own.propagate}"
    assert _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler, f"run {run}: SIGINT handler left"
print("interrupted", interrupted)
"""


def test_real_sigint_at_many_moments_of_captures_leaves_nothing_behind():
    done = subprocess.run([sys.executable, "-c", SIGINT_IN_A_CHILD, "0.00005", "300"], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    interrupted = int(done.stdout.split()[-1])
    assert interrupted > 100, done.stdout


def test_the_keyboard_interrupt_of_a_ctrl_c_during_the_block_reaches_the_real_stderr():
    script = ("import io, _signal\nfrom patchkit.upstream_output import captured\n"
              "_signal.signal(_signal.SIGINT, _signal.default_int_handler)\n"
              "with captured(io.StringIO()):\n    print('upstream chatter')\n"
              "    _signal.raise_signal(_signal.SIGINT)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "KeyboardInterrupt" in done.stderr and "upstream chatter" not in done.stdout + done.stderr


# --- threads ------------------------------------------------------------------------------------


def test_another_thread_writing_across_many_captures_loses_no_line_and_never_meets_a_closed_file(capfd):
    lines, errors, done = 3000, [], threading.Event()

    def writer() -> None:
        try:
            for number in range(lines):
                stream = sys.stdout  # what print and logging do: look the stream up, then write to it
                time.sleep(0)  # ... and another thread runs in between, as it may on a loaded machine
                try:
                    stream.write(f"line {number}\n")
                except ValueError as exc:  # "I/O operation on closed file": the line is lost
                    errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    texts = []
    thread.start()
    while not done.is_set():
        with captured(io.StringIO()) as upstream:
            time.sleep(0)
        texts.append(upstream.text)
    thread.join(60)
    out = capfd.readouterr().out
    seen = [line for line in ("".join(texts) + out).splitlines() if line.startswith("line ")]
    assert not errors, f"{len(errors)} writes met a closed file: {errors[0]}"
    assert len(texts) > 10
    assert sorted(seen, key=lambda line: int(line.split()[1])) == [f"line {n}" for n in range(lines)]


# --- no temporary directory ---------------------------------------------------------------------


def test_no_writable_temporary_directory_means_no_capture_and_one_warning(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-directory"))
    before = state_of_the_process()
    with caplog.at_level(logging.WARNING, logger="patchkit"):
        with captured(io.StringIO()) as upstream:
            print("not captured")
    assert upstream.text == "" and state_of_the_process() == before
    warned = [r.getMessage() for r in caplog.records if "not captured" in r.getMessage()]
    assert len(warned) == 1 and "temporary directory" in warned[0]


def test_patchkit_status_without_a_writable_temporary_directory_still_reports(tmp_path):
    script = ("import sys, tempfile\ntempfile.tempdir = sys.argv[1]\nfrom patchkit.cli import main\n"
              "sys.exit(main(['status', '--json', '--no-import']))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "read-only-root")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert isinstance(json.loads(done.stdout), list)
    assert "not captured" in done.stderr and "Traceback" not in done.stderr


# --- a timed-out check that keeps printing ------------------------------------------------------

CHATTY_CHECK = '''
import os, time
from patchkit import Patch, Replace, Variant


def forward(self, x):
    return x + 1000


def keeps_printing(context):
    while True:
        print("still checking")
        os.write(1, b"still checking, at the descriptor\\n")
        time.sleep(0.001)


PATCHES = (Patch(id="extra.chatty_check", summary="s", why="w", upstream="u", removal="r",
                 self_check=keeps_printing,
                 variants=(Variant(requires={{{dist!r}: ">=1"}},
                                   installs=(Replace("{package}.core:Model.forward", forward),)),)),)
'''


def test_a_timed_out_check_that_keeps_printing_cannot_write_into_doctor_json(make_upstream):
    up = make_upstream()
    (up.root / up.package / "chatty_decl.py").write_text(CHATTY_CHECK.format(dist=up.name, package=up.package))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(up.root), *filter(None, [env.get("PYTHONPATH")])])
    env["PATCHKIT_EXTRA_PATCHES"] = f"{up.package}.chatty_decl"
    for _ in range(3):
        done = subprocess.run([sys.executable, "-m", "patchkit", "doctor", "--json", "--device", "cpu", "--timeout",
                               "0.3", "--patch", "extra.chatty_check"], capture_output=True, text=True, timeout=120,
                              env=env)
        report = json.loads(done.stdout)  # nothing but the report on stdout
        (verdict,) = report["patches"]
        assert verdict["verdict"] == "failed" and "did not finish" in verdict["message"], verdict
        assert done.returncode == 1


def test_a_buffer_and_a_descriptor_number_kept_from_inside_the_capture_reach_the_real_stream_after_it(capfd):
    # What a module imported during the capture may keep (a binary writer, a descriptor for C code).
    with captured(io.StringIO()) as upstream:
        kept_buffer, kept_number = sys.stdout.buffer, sys.stdout.fileno()
        kept_buffer.write(b"bytes during\n")
        kept_buffer.flush()
        os.write(kept_number, b"descriptor during\n")
    kept_buffer.write(b"bytes after\n")
    kept_buffer.flush()
    os.write(kept_number, b"descriptor after\n")
    out, err = capfd.readouterr()
    assert "bytes during\n" in upstream.text and "descriptor during\n" in upstream.text
    assert out == "bytes after\ndescriptor after\n", (out, err)
    assert "closed file" not in err


KEPT_LOGGER_ACROSS_CAPTURES = '''
import io, logging, sys, threading
from patchkit.upstream_output import captured

stop = threading.Event()
logger = logging.getLogger("toy_upstream")
logger.propagate = False
with captured(io.StringIO()) as first:
    logger.addHandler(logging.StreamHandler(sys.stdout))  # as vLLM's logging configuration does at import
    threading.Thread(target=stop.wait, daemon=True).start()  # a thread the import leaves running
    logger.warning("said in the first capture")
with captured(io.StringIO()) as later:
    logger.warning("said in a later capture")
    print("printed in a later capture")
stop.set()
logger.warning("said after the captures")
print(repr(first.text), repr(later.text), file=sys.stderr)
'''


def test_captures_after_one_that_left_a_thread_running_still_take_what_a_kept_logger_writes():
    # The first capture keeps the thread away from standard output (sys.stdout becomes a stand-in on a
    # copy of descriptor 1); the handler that held the capture's stdout now holds that stand-in, and a
    # later capture must take what it writes, as `patchkit doctor` does check after check.
    done = subprocess.run([sys.executable, "-c", KEPT_LOGGER_ACROSS_CAPTURES], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "said after the captures\n", (done.stdout, done.stderr)
    assert "said in a later capture" in done.stderr and "printed in a later capture" in done.stderr
