"""Signals beyond SIGINT/SIGTERM during a refit: any Python handler may raise, so each is held (real vLLM, CPU).

A framework's SIGHUP ("reload") or SIGUSR1 ("dump and stop") handler that raises used to run in the
middle of the commit: the commit was broken off (and, since ``refit._commit``, undone), so the refit
the caller asked for was lost although nothing was wrong with it. Held like SIGINT, the signal
reaches its handler after the last copy: the model serves the new weights in full, then the
handler's exception reaches the caller.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import test_refit_all_or_nothing
from nvfp4_helpers import items
from patchkit.patches.vllm.refit import _impl as _refit_impl
from patchkit.patches.vllm.refit import _writes as _refit_writes
from patchkit.patches.vllm.refit import refit_weights
from test_refit_all_or_nothing import B, assert_serves_as_a_clean_refit

refitted_a = test_refit_all_or_nothing.refitted_a  # the fixture: a dummy-started model serving A


class Hangup(Exception):
    """What a framework's handler raises."""


def _raising(signum: int, frame: object) -> None:
    raise Hangup(signum)


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGUSR1], ids=["SIGHUP", "SIGUSR1"])
def test_a_raising_handler_of_another_signal_lands_after_the_commit(refitted_a: Any, signum: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    commit, commits = _refit_impl._commit, []

    def signalled_commit(*args: Any) -> None:
        if not commits:
            os.kill(os.getpid(), signum)
        commits.append(1)
        commit(*args)

    previous = signal.signal(signum, _raising)
    try:
        monkeypatch.setattr(_refit_impl, "_commit", signalled_commit)
        with pytest.raises(Hangup):
            refit_weights(refitted_a, items(dict(B)))
        monkeypatch.undo()
        assert len(commits) == 3  # every layer committed before the handler ran
        assert signal.getsignal(signum) is _raising
        assert not _refit_writes.installed()
    finally:
        signal.signal(signum, previous)
    assert_serves_as_a_clean_refit(refitted_a, B)
    refit_weights(refitted_a, items(dict(B[::-1])))
