"""``vllm.serve_signals_main_thread``: vLLM's own ``run_headless`` started in a worker thread.

Without the patch, vLLM (0.24, 0.29, 0.33) raises ``ValueError: signal only works in main thread``
before any engine starts; with it the start-up goes on to the engine processes (where the drivers
stop: see ``run_headless_in_a_thread``) and the process's handlers are left alone. On the main
thread the handlers are vLLM's, as before.
"""

from __future__ import annotations

import signal
import threading

import pytest
from patchkit.patches.vllm._checks._headless_serve import run_headless_in_a_thread
from vllm_fixtures import installed

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

pytestmark = pytest.mark.usefixtures("patches_restored")

PATCH = "vllm.serve_signals_main_thread"


@pytest.fixture
def applied():
    with installed(PATCH) as (record,):
        yield record


def test_vllm_alone_refuses_to_start_headless_in_a_worker_thread():
    """Upstream pinned: the failure the patch exists for. When a release guards these calls, this
    fails there: declare that range native. (vLLM's ``AsyncEngineArgs`` loads its general plugins,
    patchkit's among them, which applies the patch: upstream's module is put back for the run.)"""
    with patchkit.applied(PATCH), upstream_behaviour(PATCH):
        outcome = run_headless_in_a_thread()
    assert isinstance(outcome["error"], ValueError), outcome["error"]
    assert "signal only works in main thread" in str(outcome["error"])


def test_headless_start_in_a_worker_thread_reaches_the_engines_and_leaves_handlers_alone(applied):
    outcome = run_headless_in_a_thread()
    assert outcome["error"] is None
    assert outcome["before"] == outcome["after"]


def test_on_the_main_thread_vllms_handlers_are_installed(applied):
    """The patch changes nothing on the main thread: vLLM's handler is installed (restored after)."""
    from vllm.entrypoints.cli import serve

    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGUSR2)

    def handler(signum, frame):
        pass

    try:
        assert serve.signal.signal(signal.SIGUSR2, handler) is before
        assert signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR2, before)
    assert serve.signal.SIGTERM is signal.SIGTERM  # every other name is the real module's


def test_off_the_main_thread_the_call_answers_the_handler_in_place(applied):
    from vllm.entrypoints.cli import serve

    before = signal.getsignal(signal.SIGTERM)
    replacement = lambda signum, frame: None  # noqa: E731
    answers = []
    worker = threading.Thread(target=lambda: answers.append(serve.signal.signal(signal.SIGTERM, replacement)))
    worker.start()
    worker.join()
    assert answers == [before]
    assert signal.getsignal(signal.SIGTERM) is before


def test_serve_signals_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.serve_signals_main_thread")
def test_serve_signals_check_fails_with_vllms_own_signal_module(applied):
    with upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "run_headless started in a worker thread reaches the engine start: expected no error, found " \
        "ValueError: signal only works in main thread" in verdict.message, verdict.message
