"""Self-check of ``megatron.dist_ckpt_async_queue_reset``: a queue that has numbered saves starts again
at call 0, refusing while a save is unfinalised unless told to abandon it."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from patchkit.selfcheck import CheckContext, expect

from ._roundtrip import one_rank_gloo, outcome, without_cuda


def _write_marker(path: str) -> None:
    with open(path, "w", encoding="utf-8") as marker:
        marker.write("saved")


def _request(path: str) -> Any:
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest

    return AsyncRequest(_write_marker, (path,), [])


def check_dist_ckpt_async_queue_reset(context: CheckContext) -> None:
    """Real async saves (a forked worker each) through megatron's ``AsyncCallsQueue``: after one
    finalised save and one left pending, ``reset()`` refuses (``AsyncCallsPendingError``),
    ``reset(abandon=True)`` drops the pending one, and the next save is numbered 0 and finalises."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    with one_rank_gloo(), without_cuda(), tempfile.TemporaryDirectory(prefix="patchkit-queue-") as directory:
        queue = AsyncCallsQueue()
        first = queue.schedule_async_request(_request(os.path.join(directory, "first")))
        queue.maybe_finalize_async_calls(blocking=True)
        queue.schedule_async_request(_request(os.path.join(directory, "pending")))
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
