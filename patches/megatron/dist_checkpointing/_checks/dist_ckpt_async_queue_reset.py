"""Self-check of ``megatron.dist_ckpt_async_queue_reset``: a queue that has numbered saves starts again
at call 0, refusing while a save is unfinalised unless told to abandon it."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from patchkit.selfcheck import CheckContext, expect

from .._dist_ckpt_async_queue_reset import stop_workers
from ._roundtrip import one_rank_gloo, outcome, without_cuda


def _write_marker(path: str) -> None:
    with open(path, "w", encoding="utf-8") as marker:
        marker.write("saved")


def _write_marker_late(path: str) -> None:
    time.sleep(_PENDING_SAVE_S)
    _write_marker(path)


#: How long the save left pending takes, so that it is still running when the queue is reset.
_PENDING_SAVE_S = 1.0

def _request(path: str, write: Any = _write_marker) -> Any:
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    return AsyncRequest(write, (path,), [])


@contextlib.contextmanager
def _workers_stopped_at_exit(queue: Any) -> Iterator[Any]:
    """Kill and wait for the workers of saves still unfinalised when the check ends, pass or fail,
    so that none writes into the check's directory while it is removed."""
    try:
        yield queue
    finally:
        stop_workers([process for active in queue.async_calls
                      if (process := getattr(active.async_caller, "process", None)) is not None])


def check_dist_ckpt_async_queue_reset(context: CheckContext) -> None:
    """Real async saves (a forked worker each) through megatron's ``AsyncCallsQueue``: after one
    finalised save and one left pending, ``reset()`` refuses (``AsyncCallsPendingError``),
    ``reset(abandon=True)`` drops the pending one, and the next save is numbered 0 and finalises."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    with contextlib.ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory(prefix="patchkit-queue-"))
        stack.enter_context(one_rank_gloo())
        stack.enter_context(without_cuda())
        queue = stack.enter_context(_workers_stopped_at_exit(AsyncCallsQueue()))
        first = queue.schedule_async_request(_request(os.path.join(directory, "first")))
        queue.maybe_finalize_async_calls(blocking=True)
        queue.schedule_async_request(_request(os.path.join(directory, "pending"), _write_marker_late))
        refused = outcome(queue.reset)
        expect(refused.startswith("AsyncCallsPendingError") and queue.get_num_unfinalized_calls() == 1,
               "reset() refuses while a save is unfinalised and leaves the queue as it was",
               "AsyncCallsPendingError, 1 call queued", f"{refused}, {queue.get_num_unfinalized_calls()} queued")
        dropped = queue.reset(abandon=True)
        expect(dropped == 1 and queue.get_num_unfinalized_calls() == 0, "reset(abandon=True) drops the pending "
               "save", "1 dropped, 0 queued", f"{dropped} dropped, {queue.get_num_unfinalized_calls()} queued")
        again = queue.schedule_async_request(_request(os.path.join(directory, "again")))
        finalised = queue.maybe_finalize_async_calls(blocking=True)
        expect((first, again, finalised) == (0, 0, [0]), "after reset the next save is call 0, as on a fresh "
               "queue, and finalises", (0, 0, [0]), (first, again, finalised))
        expect(os.path.exists(os.path.join(directory, "again")), "the save after the reset ran")
        time.sleep(_PENDING_SAVE_S)
        expect(not os.path.exists(os.path.join(directory, "pending")), "the abandoned save wrote nothing "
               "after reset returned")
