"""``AsyncCallsQueue.reset``: empty the queue, stop its workers, restart ``call_idx``; no collective.

0.15-0.19 have ``close(abort=True)`` on the queue and its callers (kill the worker, skip finalisation);
0.14's ``close()`` always finalises, which is a collective, so there the workers are stopped directly.
Upstream's abort kills a worker without waiting for it; reset waits, so an abandoned save can write
nothing once reset has returned.
"""

from __future__ import annotations

import logging
from typing import Any

from .._errors import AsyncCallsPendingError

logger = logging.getLogger(__name__)

#: How long a killed worker process is waited for.
JOIN_TIMEOUT_S = 60.0


def _check_pending(queue: Any, abandon: bool) -> int:
    pending = len(queue.async_calls)
    if pending and not abandon:
        raise AsyncCallsPendingError(pending)
    if pending:
        logger.warning("patchkit: resetting the async checkpoint queue drops %d unfinalised save(s) "
                       "(call indices %s)", pending, [active.idx for active in queue.async_calls])
    return pending


def _restart(queue: Any) -> None:
    queue.async_calls.clear()
    queue.call_idx = -1


def worker_processes(queue: Any) -> list[Any]:
    """The processes that ``queue.close(abort=True)`` kills: each call's own worker, and the
    persistent worker (shared by the class) when this queue uses it."""
    callers = [active.async_caller for active in queue.async_calls]
    if queue.persistent:
        callers.append(getattr(type(queue), "_persistent_caller", None))
    processes = (getattr(caller, "process", None) for caller in callers)
    return [process for process in processes if process is not None]


def stop_workers(processes: list[Any]) -> None:
    """Kill each of ``processes`` still alive and wait for it (its last write done once this returns)."""
    for process in processes:
        if process.is_alive():
            process.kill()
    _wait_until_gone(processes)


def _wait_until_gone(processes: list[Any]) -> None:
    for process in processes:
        process.join(JOIN_TIMEOUT_S)
        if process.is_alive():
            logger.warning("patchkit: async checkpoint worker %s still runs %.0f s after it was killed",
                           process.pid, JOIN_TIMEOUT_S)


def reset(self: Any, abandon: bool = False) -> int:
    """Empty this queue and restart its call index, in place, on this rank (call it on every rank).

    Raises :class:`AsyncCallsPendingError` while saves are unfinalised, unless ``abandon`` is true:
    then their workers are stopped and they are dropped. Returns the number of saves dropped.
    """
    pending = _check_pending(self, abandon)
    killed = worker_processes(self)
    if not self.persistent:
        for active in self.async_calls:
            active.async_caller.close(abort=True)
    self.close(abort=True)  # closes the persistent worker, without finalising (no collective)
    _wait_until_gone(killed)
    _restart(self)
    return pending


def reset_v014(self: Any, abandon: bool = False) -> int:
    """:func:`reset` for megatron-core 0.14, whose ``close()`` always finalises (a collective)."""
    pending = _check_pending(self, abandon)
    stop_workers([process for active in self.async_calls
                  if (process := getattr(active.async_caller, "process", None)) is not None])
    for active in self.async_calls:
        if hasattr(active.async_caller, "process"):
            active.async_caller.process = None
    persistent = getattr(self, "persistent_caller", None)
    if persistent is not None:
        persistent.close()
        self.persistent_caller = None
    _restart(self)
    return pending
