"""The TCPStore port ``vllm/v1/executor/ray_executor_v2.py`` (0.24-0.28) gives its rank-0 worker, searched
past the broadcast queue's ports.

vLLM picks both ports with a probe from ``VLLM_PORT`` (``vllm.utils.network_utils._get_open_port``): the
store's first, released at once, then the queue's, bound at once: the same port. Here the module's ``get_open_port``
searches :data:`STORE_PORT_OFFSET` .. :data:`STORE_PORT_OFFSET` + :data:`STORE_PORT_WINDOW` - 1 ports past
``VLLM_PORT`` (0.25-0.28 call it after their data-parallel window, which for an engine that is not
data-parallel starts at port 100 and, where ports below 1024 cannot be bound, fails); vLLM's
``get_open_port()`` stands when ``VLLM_PORT`` is unset or every port of the window is taken.
"""

from __future__ import annotations

import logging

from vllm.utils.network_utils import get_open_port

logger = logging.getLogger(__name__)

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
