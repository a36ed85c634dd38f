"""A lock around ``send_multipart`` on the input socket of vLLM's ``AsyncMPClient``.

``AsyncMPClient.__init__`` builds ``input_socket`` (a ``zmq.asyncio`` socket); every request leaves
through ``input_socket.send_multipart``, which hands the message to the plain socket beneath it
(``_shadow_sock``): at once when the socket can take it, or later from the event loop that polls it.
Both paths call the plain socket's ``send_multipart``, so that is where the lock goes: on this one
socket instance, for the whole message, so the frames of one request are never split by another
thread's. Other sockets of the process keep pyzmq's own method.

A client built before the patch was installed keeps an unguarded socket (patchkit installs it when
vLLM's ``core_client`` is imported, before any client exists).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

#: Set on the locked ``send_multipart``: the lock it holds, and the mark that a socket is guarded already.
LOCK_ATTRIBUTE = "__patchkit_send_lock__"


def _plain_socket(socket: Any) -> Any:
    """The socket whose ``send_multipart`` sends the frames: a ``zmq.asyncio`` socket's shadow, else itself."""
    return getattr(socket, "_shadow_sock", socket)


def send_lock(socket: Any) -> threading.RLock | None:
    """The lock ``guard_sends`` put on ``socket``'s sends, or None when they are unguarded."""
    return getattr(_plain_socket(socket).__dict__.get("send_multipart"), LOCK_ATTRIBUTE, None)


def guard_sends(socket: Any) -> None:
    """Make ``send_multipart`` on ``socket`` (a ``zmq.asyncio`` or plain ZMQ socket) hold one lock per call.

    Re-entrant: a send made from inside a send (pyzmq's own callbacks) does not deadlock. Idempotent.
    Set with ``object.__setattr__``: pyzmq's ``Socket.__setattr__`` reads unknown names as socket options.
    """
    plain = _plain_socket(socket)
    if send_lock(plain) is not None:
        return
    lock = threading.RLock()
    unlocked = plain.send_multipart

    @functools.wraps(unlocked)
    def send_multipart(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return unlocked(*args, **kwargs)

    setattr(send_multipart, LOCK_ATTRIBUTE, lock)
    object.__setattr__(plain, "send_multipart", send_multipart)


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    """``AsyncMPClient.__init__`` that guards the input socket it built (also for its data-parallel subclasses,
    whose ``__init__`` calls this one)."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        socket = getattr(self, "input_socket", None)
        if socket is not None:
            guard_sends(socket)

    return __init__
