"""vLLM's ``MessageQueue`` built while another process holds the port its probe found free: the driver of the
``vllm.shm_broadcast_bind_retry`` self-check and its tests.

The race is made certain rather than waited for: a rival ZMQ socket binds port 0 (the kernel's choice,
held from then on), and the queue's probe (``shm_broadcast.get_open_port``, on releases that probe)
answers that port, as it does when the rival binds between the probe's release and the queue's bind.
Releases that bind port 0 never ask the probe. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import zmq

#: The address the queue and its readers use: loopback only.
LOOPBACK = "127.0.0.1"


def _port_of(socket: zmq.Socket) -> int:  # type: ignore[type-arg]
    endpoint = socket.getsockopt(zmq.LAST_ENDPOINT)
    return int((endpoint.decode() if isinstance(endpoint, bytes) else str(endpoint)).rpartition(":")[2])


@contextlib.contextmanager
def rival_holding_a_port(host: str = LOOPBACK) -> Iterator[int]:
    """A ZMQ ``XPUB`` socket bound to a kernel-chosen port of ``host`` for the block: yields that port."""
    context = zmq.Context()
    rival = context.socket(zmq.XPUB)
    try:
        rival.bind(f"tcp://{host}:0")
        yield _port_of(rival)
    finally:
        rival.close(linger=0)
        context.term()


@contextlib.contextmanager
def probe_answers(port: int) -> Iterator[None]:
    """``shm_broadcast``'s port probe answers ``port`` for the block (where the module probes at all)."""
    from vllm.distributed.device_communicators import shm_broadcast

    original = getattr(shm_broadcast, "get_open_port", None)
    if original is None:
        yield
        return
    shm_broadcast.get_open_port = lambda *args, **kwargs: port
    try:
        yield
    finally:
        shm_broadcast.get_open_port = original


def close_queue(queue: Any) -> None:
    """Close the queue's ZMQ sockets now (vLLM closes them when the queue is collected)."""
    for name in ("remote_socket", "local_socket"):
        socket = getattr(queue, name, None)
        if socket is not None:
            socket.close(linger=0)


def subscriber_reaches(queue: Any, timeout_s: float) -> bool:
    """A ZMQ subscriber connected to the queue's advertised address reaches the queue's socket within ``timeout_s``
    (its subscription arrives there: the queue's ``XPUB`` is verbose)."""
    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    try:
        subscriber.connect(queue.handle.remote_subscribe_addr)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        if not queue.remote_socket.poll(timeout=int(timeout_s * 1000)):
            return False
        return bool(queue.remote_socket.recv()[:1] == b"\x01")
    finally:
        subscriber.close(linger=0)
        context.term()


def queue_after_a_lost_port_race(timeout_s: float = 10.0, host: str = LOOPBACK) -> dict[str, Any]:
    """Build ``MessageQueue(n_reader=1, n_local_reader=0)`` (one remote reader: a TCP socket) while a rival holds
    the port its probe answers. What happened: ``error`` (the exception, or None), ``lost_port``,
    ``advertised`` (the handle's ``remote_subscribe_addr``) and ``reached`` (a subscriber connected to it
    reached the queue)."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    outcome: dict[str, Any] = {"error": None, "lost_port": None, "advertised": None, "reached": False}
    with rival_holding_a_port(host) as port:
        outcome["lost_port"] = port
        # Built in two steps so that a queue whose __init__ raised still has its sockets closed here: a ZMQ
        # context collected while one of its sockets is open blocks the collecting thread for good.
        queue = MessageQueue.__new__(MessageQueue)
        try:
            with probe_answers(port):
                queue.__init__(n_reader=1, n_local_reader=0, connect_ip=host)
        except zmq.ZMQError as error:
            close_queue(queue)
            outcome["error"] = error
            return outcome
        try:
            outcome["advertised"] = queue.handle.remote_subscribe_addr
            outcome["reached"] = subscriber_reaches(queue, timeout_s)
        finally:
            close_queue(queue)
    return outcome


def round_trip_after_a_lost_port_race(message: Any, timeout_s: float = 30.0,
                                      host: str = LOOPBACK) -> dict[str, Any]:
    """``queue_after_a_lost_port_race``'s writer, then vLLM's own remote reader made from its handle
    (``MessageQueue.create_from_handle``): both sides' ``wait_until_ready``, then ``message`` enqueued and
    dequeued. What happened: ``received`` (or ``error``); each side runs in a thread joined within ``timeout_s``."""
    from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

    outcome: dict[str, Any] = {"error": None, "received": None}
    with rival_holding_a_port(host) as port:
        with probe_answers(port):
            writer = MessageQueue(n_reader=1, n_local_reader=0, connect_ip=host)
        reader = MessageQueue.create_from_handle(writer.handle, 0)
        errors: list[BaseException] = []

        def side(steps: Any) -> None:
            try:
                steps()
            except Exception as error:  # reported to the caller below
                errors.append(error)

        def read() -> None:
            reader.wait_until_ready()
            outcome["received"] = reader.dequeue()

        def write() -> None:
            writer.wait_until_ready()
            writer.enqueue(message)

        threads = [threading.Thread(target=side, args=(steps,), name=f"patchkit-mq-{steps.__name__}", daemon=True)
                   for steps in (read, write)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout_s)
        stuck = [thread.name for thread in threads if thread.is_alive()]
        if errors:
            outcome["error"] = errors[0]
        elif stuck:
            outcome["error"] = TimeoutError(f"{stuck} still waiting after {timeout_s} s")
        if not stuck:
            close_queue(writer)
            close_queue(reader)
    return outcome
