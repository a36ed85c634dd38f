"""Self-check of ``bridge.signal_handler_main_thread``: ``DistributedSignalHandler`` enters and releases in a
worker thread and leaves the process's handler alone.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from patchkit.selfcheck import CheckContext, expect


def enter_off_the_main_thread(sig: int = signal.SIGTERM) -> dict[str, Any]:
    """Enter and release Bridge's ``DistributedSignalHandler`` in a fresh thread, as a trainer in a
    Ray worker thread does; what happened: ``error`` (None or the exception), ``received`` (its
    ``signals_received()``), ``released`` (``release()``'s answer) and the process's handler for
    ``sig`` before and after."""
    from megatron.bridge.training.utils.sig_utils import DistributedSignalHandler

    outcome: dict[str, Any] = {"error": None, "before": signal.getsignal(sig)}

    def enter_and_release() -> None:
        try:
            with DistributedSignalHandler(sig) as handler:
                outcome["during"] = signal.getsignal(sig)
                outcome["received"] = handler.signals_received()
            outcome["released"] = handler.released
        except BaseException as exc:  # the thread's error is the finding
            outcome["error"] = exc

    worker = threading.Thread(target=enter_and_release, name="patchkit-signal-check")
    worker.start()
    worker.join()
    outcome["after"] = signal.getsignal(sig)
    return outcome


def check_signal_handler_main_thread(context: CheckContext) -> None:
    """``DistributedSignalHandler`` enters and releases in a worker thread and leaves the process's handler alone."""
    outcome = enter_off_the_main_thread()
    error = outcome["error"]
    expect(error is None, "DistributedSignalHandler entered in a worker thread", "no error",
           f"{type(error).__name__}: {error}" if error is not None else None)
    expect(outcome["received"] == [False] and outcome["released"] is True,
           "its signals_received() and release() in that thread", "[False], released",
           f"{outcome['received']}, released={outcome['released']}")
    expect(outcome["before"] is outcome["during"] is outcome["after"],
           "the process's SIGTERM handler while and after it was entered off the main thread", "unchanged",
           f"{outcome['before']!r} -> {outcome['during']!r} -> {outcome['after']!r}")
