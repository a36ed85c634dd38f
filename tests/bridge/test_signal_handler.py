"""``bridge.signal_handler_main_thread``: Bridge's ``DistributedSignalHandler`` entered in a worker thread.

Bridge 0.2-0.5 raise ``ValueError`` there (``signal.signal`` off the main thread); the patch installs
the handler on the main thread only, as Bridge 0.6 does natively (#4375). Each test calls Bridge's
own class; environments: modelopt-0.47-bridge-0.3, modelopt-0.44-bridge-0.5 (patched),
modelopt-0.48-bridge-0.6 (native).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import pytest
from doctor_verdicts import bypassed_verdict, verdict_of
from patchkit.patches.bridge._checks.signal_handler_main_thread import enter_off_the_main_thread

import patchkit
from patchkit.doctor import FAILED, VERIFIED
from patchkit.runtime.status import Reason
from patchkit.selfcheck import upstream_behaviour

PATCH = "bridge.signal_handler_main_thread"


pytestmark = pytest.mark.usefixtures("patches_restored")


def _native() -> bool:
    with patchkit.applied(PATCH) as (record,):
        return record.reason is Reason.NATIVE


def test_bridge_alone_off_the_main_thread_raises_before_0_6_and_not_from_0_6():
    """Upstream pinned: the failure the patch exists for (0.2-0.5), and its absence where native (0.6)."""
    native = _native()
    # Upstream's own code, even where an earlier test of the session left the patch applied.
    left_applied = bool(patchkit.engine().installed_actions(PATCH))
    with upstream_behaviour(PATCH) if left_applied else contextlib.nullcontext():
        outcome = enter_off_the_main_thread()
    if native:
        assert outcome["error"] is None
    else:
        assert isinstance(outcome["error"], ValueError)
        assert "signal only works in main thread" in str(outcome["error"])
    assert outcome["before"] is outcome["after"]


def test_handler_enters_and_releases_in_a_worker_thread(applied):
    outcome = enter_off_the_main_thread()
    assert outcome["error"] is None
    assert outcome["received"] == [False]
    assert outcome["released"] is True
    assert outcome["before"] is outcome["during"] is outcome["after"]


def test_on_the_main_thread_the_handler_still_catches_the_signal_and_is_restored(applied):
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    assert threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGUSR2)
    with DistributedSignalHandler(signal.SIGUSR2) as handler:
        assert signal.getsignal(signal.SIGUSR2) is not before
        os.kill(os.getpid(), signal.SIGUSR2)  # delivered to this (main) thread before kill returns
        assert handler.signals_received() == [True]
    assert signal.getsignal(signal.SIGUSR2) is before


def test_a_handler_entered_before_the_patch_is_released_the_upstream_way():
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    before = signal.getsignal(signal.SIGUSR2)
    handler = DistributedSignalHandler(signal.SIGUSR2).__enter__()  # as data/loaders.py does
    with patchkit.applied(PATCH):
        assert handler.release() is True
        assert handler.release() is False  # released once, as upstream
    assert signal.getsignal(signal.SIGUSR2) is before


def test_release_off_the_main_thread_of_a_handler_entered_there_changes_nothing(applied):
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    before = signal.getsignal(signal.SIGTERM)
    errors: list[BaseException] = []
    handlers: list[object] = []

    def enter_only() -> None:  # data/loaders.py enters and never releases
        try:
            handlers.append(DistributedSignalHandler().__enter__())
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=enter_only)
    worker.start()
    worker.join()
    assert not errors
    (handler,) = handlers
    assert handler.release() is True  # on the main thread now: nothing to restore, nothing restored
    assert signal.getsignal(signal.SIGTERM) is before


def test_signal_handler_check_is_verified(applied):
    verdict = verdict_of(PATCH)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("bridge.signal_handler_main_thread")
def test_signal_handler_check_fails_with_bridges_unguarded_enter(applied, monkeypatch):
    def every_thread_is_main() -> None:
        # 0.6's guard reads threading.main_thread(): make every thread look like the main one.
        from megatron.bridge.training.utils import sig_utils

        class EveryThreadIsMain:
            current_thread = staticmethod(threading.current_thread)
            main_thread = staticmethod(threading.current_thread)

        monkeypatch.setattr(sig_utils, "threading", EveryThreadIsMain)

    verdict = bypassed_verdict(PATCH, applied.reason is Reason.NATIVE, every_thread_is_main)
    assert verdict.verdict == FAILED
    assert "DistributedSignalHandler entered in a worker thread: expected no error, found ValueError: signal only " \
        "works in main thread" in verdict.message, verdict.message
