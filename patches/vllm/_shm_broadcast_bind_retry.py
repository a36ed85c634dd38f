"""The ZMQ context ``vllm/distributed/device_communicators/shm_broadcast.py`` makes its sockets with, and
``MessageQueue.__init__`` advertising the port its remote socket bound.

vLLM 0.24-0.28 build a queue's remote socket as::

    remote_subscribe_port = get_open_port()     # bind a probe socket, release it, return the number
    ...
    socket_addr = ...                           # the TCP address of connect_ip, that port
    self.remote_socket.bind(socket_addr)
    remote_subscribe_addr = ...                 # the same address, for the handle

A process that binds the port between the probe and the bind wins it. Here a TCP bind that fails with
``EADDRINUSE`` asks vLLM's ``get_open_port()`` again and binds what it answers: the winner now holds
the lost port, so the probe passes it (from ``VLLM_PORT`` when that is set, as before; a kernel-chosen
port otherwise), and each retry moves on. The queue's ``__init__`` then writes the port the socket
holds into ``handle.remote_subscribe_addr``, which readers connect to. Binds that are not TCP
(``ipc://`` for local readers), other errors and port-0 binds are vLLM's own.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable
from urllib.parse import urlsplit

import zmq
from vllm.utils.network_utils import get_open_port

logger = logging.getLogger(__name__)

#: Binds tried before the last ``EADDRINUSE`` is raised: each retry passes a port a rival holds.
BIND_ATTEMPTS = 64


def _tcp_port(address: str) -> tuple[str, int] | None:
    """``(address up to its port, port)`` for a TCP address with an explicit, non-zero port; else None."""
    if urlsplit(address).scheme != "tcp":
        return None
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return None
    return host, int(port)


class BindRetrySocket(zmq.Socket):  # type: ignore[type-arg]
    """A ZMQ socket whose TCP bind moves to the next free port when its port was taken (``EADDRINUSE``)."""

    def bind(self, addr: str) -> Any:
        """``zmq.Socket.bind``; on ``EADDRINUSE`` for a TCP address with a port, bind its host on the
        port vLLM's ``get_open_port()`` answers now, up to ``BIND_ATTEMPTS`` binds in all."""
        for attempt in range(1, BIND_ATTEMPTS + 1):
            try:
                return super().bind(addr)
            except zmq.ZMQError as error:
                parsed = _tcp_port(addr)
                if error.errno != zmq.EADDRINUSE or parsed is None or attempt == BIND_ATTEMPTS:
                    raise
                host, lost = parsed
                addr = f"{host}:{get_open_port()}"
                logger.info("patchkit: vLLM's message queue lost port %d between its probe and its bind "
                            "(bind %d of %d); binding %s", lost, attempt, BIND_ATTEMPTS, addr)
        raise AssertionError("unreachable: the last attempt returns or raises")


class BindRetryContext(zmq.Context):  # type: ignore[type-arg]
    """``zmq.Context`` as ``shm_broadcast`` uses it, making ``BindRetrySocket`` sockets."""

    _socket_class = BindRetrySocket


def _bound_address(advertised: str, socket: zmq.Socket) -> str:  # type: ignore[type-arg]
    """``advertised`` (a TCP address, host and port) with the port ``socket`` is bound to (its last endpoint)."""
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    bound_port = (endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)).rpartition(":")[2]
    host, _, port = advertised.rpartition(":")
    return advertised if port == bound_port else f"{host}:{bound_port}"


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    """``MessageQueue.__init__`` whose handle names the port its remote socket bound (after a retry, not the
    probed one)."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        remote = getattr(self, "remote_socket", None)
        advertised = getattr(self.handle, "remote_subscribe_addr", None)
        if remote is not None and advertised:
            self.handle.remote_subscribe_addr = _bound_address(advertised, remote)

    return __init__
