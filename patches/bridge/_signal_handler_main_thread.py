"""``DistributedSignalHandler`` installs its handler on the main thread only (Bridge 0.2-0.5).

Mirrors Megatron-Bridge #4375 (``sig_utils.py`` in v0.6.0): off the main thread ``__enter__`` sets
up the same state as upstream (no signal received, not released, the current handler remembered)
and installs nothing; ``release`` then restores nothing. A worker thread cannot receive signals
anyway (CPython runs handlers on the main thread), so ``signals_received()`` reports False there,
as it does on 0.6. On the main thread both are upstream's, unchanged.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

#: Set on each handler by the patched ``__enter__``: whether ``signal.signal`` was called (0.6's name).
INSTALLED = "_installed"


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def wrap_enter(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Upstream's ``__enter__`` on the main thread; elsewhere its state without the handler."""

    @functools.wraps(original)
    def __enter__(self: Any) -> Any:
        if _on_main_thread():
            entered = original(self)
            setattr(self, INSTALLED, True)
            return entered
        self._signal_received = False
        self.released = False
        self.original_handler = signal.getsignal(self.sig)
        setattr(self, INSTALLED, False)
        logger.debug("patchkit: DistributedSignalHandler entered in thread %r: no handler installed for %s "
                     "(signals are delivered to the main thread only)", threading.current_thread().name, self.sig)
        return self

    return __enter__


def wrap_release(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Upstream's ``release`` unless ``__enter__`` installed nothing (then only the bookkeeping)."""

    @functools.wraps(original)
    def release(self: Any) -> bool:
        # A handler entered before the patch was applied has no flag: it did install, upstream's way.
        if getattr(self, INSTALLED, True) or self.released:
            return original(self)
        self.released = True
        return True

    return release
