"""One refit call at a time per model, with signals held while it runs (``_signals``).

Each public refit call (``prepare_refit``, ``finish_refit``, ``abort_refit``, and the whole of
``refit_weights`` and of a ``with refit(model)`` block) claims the model first. The claim is a
test-and-set under one process-wide lock, so of two threads arriving together exactly one gets it;
the other is refused at once with :class:`RefitInProgressError` and changes nothing. The claim is
taken inside the signal window and dropped when the call ends or when a signal interrupts its load
phase (after the rollback), so a Ctrl-C cannot leave it behind.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import torch

from .._errors import RefitError, RefitInProgressError
from ._signals import SignalWindow, deliver

#: where the running call's claim lives on the model
CLAIM_ATTR = "_patchkit_refit_claim"

_claims = threading.Lock()


class RefitCall:
    """One public refit call on one model: its claim and its signal window."""

    def __init__(self, model: torch.nn.Module, rollback: Callable[[torch.nn.Module], None]) -> None:
        self.model = model
        self.thread = threading.current_thread().name
        self.window = SignalWindow(self._interrupted)
        self._rollback = rollback

    def _interrupted(self) -> None:
        try:
            self._rollback(self.model)
        finally:
            self._release()

    def _claim(self) -> None:
        with _claims:
            holder = self.model.__dict__.get(CLAIM_ATTR)
            if holder is None:
                object.__setattr__(self.model, CLAIM_ATTR, self)
                return
        raise RefitInProgressError(
            f"a refit call is already running on this model (in thread {holder.thread!r}); refits of one"
            " model must not overlap: wait for it to return"
        )

    def _release(self) -> None:
        with _claims:
            if self.model.__dict__.get(CLAIM_ATTR) is self:
                del self.model.__dict__[CLAIM_ATTR]

    def check_not_interrupted(self) -> None:
        """After the load phase: a caller that caught the interrupt must not go on to finish."""
        if self.window.closed:
            raise RefitError("the refit was interrupted by a signal during loading and rolled back; the model"
                             " serves its previous weights")


@contextlib.contextmanager
def claimed(model: torch.nn.Module, rollback: Callable[[torch.nn.Module], None]) -> Iterator[RefitCall]:
    """Hold signals, claim ``model`` (RefitInProgressError if claimed), run the block, release.

    ``rollback`` is what an interrupt during the call's interruptible part runs before the signal's
    exception is let through.
    """
    call = RefitCall(model, rollback)
    call.window.open()
    try:
        call._claim()
        try:
            yield call
        finally:
            call._release()
    finally:
        deliver(call.window.close())
