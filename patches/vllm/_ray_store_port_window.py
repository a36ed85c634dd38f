"""The TCPStore port ``vllm/v1/executor/ray_executor_v2.py`` (0.24-0.28) gives its rank-0 worker, searched
past the broadcast queue's ports.

vLLM picks both ports with a probe from ``VLLM_PORT`` (``vllm.utils.network_utils._get_open_port``): the
store's first, released at once, then the queue's, bound at once: the same port. Here the module's ``get_open_port``
searches :data:`STORE_PORT_OFFSET` .. :data:`STORE_PORT_OFFSET` + :data:`STORE_PORT_WINDOW` - 1 ports past
``VLLM_PORT`` first, and on 0.25-0.28 ``_select_tcpstore_port`` tries that window before vLLM's
data-parallel window (which for an engine that is not data-parallel starts at port 100) as
:func:`window_before_vllms_dp_window` says; vLLM's ``get_open_port()`` stands when ``VLLM_PORT`` is unset or
every port of the window is taken.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from vllm.utils.network_utils import get_open_port

from patchkit.runtime import settings

logger = logging.getLogger(__name__)

RAY_EXECUTOR_V2 = "vllm.v1.executor.ray_executor_v2"

#: Where the store's search starts, past ``VLLM_PORT``: the queue's search from ``VLLM_PORT`` stays below.
STORE_PORT_OFFSET = 32
#: Ports the store's search tries; offset and window stay inside the 100 ports an engine is given.
STORE_PORT_WINDOW = 32


def port_in_window() -> int | None:
    """A free port from ``VLLM_PORT + STORE_PORT_OFFSET`` (``STORE_PORT_WINDOW`` tried); None when
    ``VLLM_PORT`` is unset or every port of the window is taken."""
    import vllm.envs as envs
    from vllm.utils.network_utils import _get_open_port

    base = envs.VLLM_PORT
    if base is None:
        return None
    start = base + STORE_PORT_OFFSET
    try:
        return _get_open_port(start_port=start, max_attempts=STORE_PORT_WINDOW)
    except RuntimeError:
        logger.warning("patchkit: no free port for vLLM's TCPStore in %d-%d; vLLM chooses it (the broadcast "
                       "queue may take the same port)", start, start + STORE_PORT_WINDOW - 1)
        return None


def store_port() -> int:
    """``get_open_port()`` as ``ray_executor_v2`` calls it, only ever for the TCPStore (0.24's
    ``_init_executor``; 0.25-0.28's ``_select_tcpstore_port`` when the engine is not data-parallel or its
    data-parallel window is full): a port of the store's window, else vLLM's ``get_open_port()``."""
    port = port_in_window()
    return get_open_port() if port is None else port


def window_before_vllms_dp_window(local_dp_rank: int | None, master_port: int) -> bool:
    """Whether the store's window is searched before vLLM's data-parallel window (0.25-0.28): for an engine
    that is not data-parallel (no rank, or master port 0, where vLLM's window starts at port 100), and for
    every engine with ``PATCHKIT_RAY_STORE_PORT_WINDOW=always``. A malformed value reads as the default
    (``apply_all()`` reports it)."""
    if local_dp_rank is None or master_port == 0:
        return True
    try:
        return settings.choice(settings.RAY_STORE_PORT_WINDOW) == "always"
    except settings.ConfigError:
        return False


def _wrap_select_tcpstore_port(original: Callable[[int | None, int], int]) -> Callable[[int | None, int], int]:
    @functools.wraps(original)
    def _select_tcpstore_port(local_dp_rank: int | None, master_port: int) -> int:
        if window_before_vllms_dp_window(local_dp_rank, master_port):
            port = port_in_window()
            if port is not None:
                return port
        return original(local_dp_rank, master_port)

    _select_tcpstore_port.__patchkit_original__ = original  # type: ignore[attr-defined]
    return _select_tcpstore_port


def install_window_before_dp_window() -> None:
    """0.25-0.28: wrap ``RayExecutorV2._select_tcpstore_port`` (a static method) so the store's window comes
    before vLLM's data-parallel window where :func:`window_before_vllms_dp_window` says so. 0.24 has no such
    method (its one call is ``get_open_port()``, replaced by :func:`store_port`): nothing to do."""
    import sys

    executor: Any = sys.modules[RAY_EXECUTOR_V2].RayExecutorV2
    raw = executor.__dict__.get("_select_tcpstore_port")
    if not isinstance(raw, staticmethod) or hasattr(raw.__func__, "__patchkit_original__"):
        return
    executor._select_tcpstore_port = staticmethod(_wrap_select_tcpstore_port(raw.__func__))


def uninstall_window_before_dp_window() -> None:
    """Put back the ``_select_tcpstore_port`` :func:`install_window_before_dp_window` wrapped, if it is still
    the one installed (a wrapper another library put on top is left alone)."""
    import sys

    module = sys.modules.get(RAY_EXECUTOR_V2)
    executor: Any = getattr(module, "RayExecutorV2", None)
    raw = executor.__dict__.get("_select_tcpstore_port") if executor is not None else None
    original = getattr(getattr(raw, "__func__", None), "__patchkit_original__", None)
    if original is not None:
        executor._select_tcpstore_port = staticmethod(original)
