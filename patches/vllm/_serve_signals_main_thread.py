"""The ``signal`` module as ``vllm/entrypoints/cli/serve.py`` sees it: handlers on the main thread only.

``run_headless`` and ``run_multi_api_server`` (0.24-0.33) call ``signal.signal(signal.SIGTERM, ...)``
and ``signal.signal(signal.SIGINT, ...)`` for a graceful shutdown. Off the main thread CPython
refuses (``ValueError``); there the handler could never run anyway, since signals are delivered to
the main thread, whose handlers (the Ray worker's) stay in charge of shutting the process down. So
off the main thread the call installs nothing, logs it at debug level and answers the handler in
place, as ``signal.signal`` answers the previous one. Every other name is the real module's.
"""

from __future__ import annotations

import logging
import signal as _signal
import threading
from typing import Any

logger = logging.getLogger(__name__)


class MainThreadSignals:
    """Stands in for the ``signal`` module inside vLLM's serve module."""

    def __getattr__(self, name: str) -> Any:
        return getattr(_signal, name)

    @staticmethod
    def signal(signalnum: int, handler: Any) -> Any:
        """``signal.signal`` on the main thread; elsewhere install nothing and return the current handler."""
        if threading.current_thread() is threading.main_thread():
            return _signal.signal(signalnum, handler)
        logger.debug("patchkit: vLLM start-up in thread %r: no handler installed for %s (signals are delivered "
                     "to the main thread only)", threading.current_thread().name, _signal.Signals(signalnum).name)
        return _signal.getsignal(signalnum)

    def __repr__(self) -> str:
        return "<patchkit: the signal module, handlers installed on the main thread only>"


MAIN_THREAD_SIGNALS = MainThreadSignals()
