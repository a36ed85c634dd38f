"""Two threads sending through one vLLM ``AsyncMPClient`` at once, as two event loops sharing an ``AsyncLLM`` do.

The client is vLLM's own, built with ``client_addresses`` (engines managed elsewhere, as vLLM's API
servers build theirs): this process plays engine core 0 on a ``DEALER`` socket connected to the client's
input address, answering the ready handshake with an empty payload, and reads what the client sends.
Each thread runs its own event loop and sends aborts through ``abort_requests_async``, the client's own
send path (``_send_input`` -> ``_send_input_message`` -> ``input_socket.send_multipart``).

Threads rarely switch inside a three-frame send, so a handover makes the interleaving certain where
nothing prevents it: after a thread sends a frame with more to come, it waits (at most
``HANDOVER_WAIT_S``) for another thread to send one. Unguarded sends then alternate frame by frame;
sends under a lock never hand over, and each wait runs out. Every socket is ``ipc://`` in a private
directory; every receive has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import threading
from typing import Any, Iterator

import msgspec
import zmq

from .._engine_client_send_lock import send_lock

#: How long a sender that has sent a frame with more to come waits for another thread's frame.
HANDOVER_WAIT_S = 0.05
#: How long the engine waits for the next message before it takes the stream as ended.
RECEIVE_TIMEOUT_MS = 500
#: vLLM's ZMQ identity of engine core rank 0 (``rank.to_bytes(2, "little")`` in ``MPClient``).
ENGINE_IDENTITY = (0).to_bytes(2, "little")


class FrameHandover:
    """A socket's ``send`` that, after a frame with ``SNDMORE``, lets another thread's frame go first.

    Bounded: when no other thread sends within ``HANDOVER_WAIT_S``, the sender goes on alone.
    """

    def __init__(self, send: Any) -> None:
        self._send = send
        self._turn = threading.Condition()
        self._last_sender: int | None = None

    def __call__(self, data: Any, flags: int = 0, **kwargs: Any) -> Any:
        result = self._send(data, flags, **kwargs)
        me = threading.get_ident()
        with self._turn:
            self._last_sender = me
            self._turn.notify_all()
            if flags & zmq.SNDMORE:
                self._turn.wait_for(lambda: self._last_sender != me, timeout=HANDOVER_WAIT_S)
        return result


@contextlib.contextmanager
def client_with_an_engine() -> Iterator[tuple[Any, zmq.Socket]]:  # type: ignore[type-arg]
    """vLLM's ``AsyncMPClient`` for one engine, and the engine's ``DEALER`` socket (already handshaken)."""
    from vllm.config import VllmConfig
    from vllm.v1.engine.core_client import AsyncMPClient

    directory = tempfile.mkdtemp(prefix="patchkit-sends-")
    addresses = {"input_address": f"ipc://{directory}/input", "output_address": f"ipc://{directory}/output"}
    context = zmq.Context()
    engine = context.socket(zmq.DEALER)
    engine.setsockopt(zmq.IDENTITY, ENGINE_IDENTITY)
    engine.setsockopt(zmq.RCVTIMEO, RECEIVE_TIMEOUT_MS)
    engine.setsockopt(zmq.LINGER, 0)
    # ZMQ queues a connected socket's messages until the peer binds: the ready message waits for the client.
    engine.connect(addresses["input_address"])
    engine.send(b"")
    client = None
    try:
        client = AsyncMPClient(vllm_config=VllmConfig(), executor_class=None, log_stats=False,
                               client_addresses=addresses)
        yield client, engine
    finally:
        if client is not None:
            client.shutdown()
        engine.close()
        context.term()
        shutil.rmtree(directory, ignore_errors=True)


def _send_aborts(client: Any, request_ids: list[str], start: threading.Barrier, errors: list[BaseException]) -> None:
    """One thread: its own event loop sends one abort per id through the client, after every sender is ready."""

    async def send() -> None:
        start.wait()
        for request_id in request_ids:
            await client.abort_requests_async([request_id])

    try:
        asyncio.run(send())
    except BaseException as error:  # noqa: BLE001 - reported to the caller, which names it
        errors.append(error)


def _received(engine: zmq.Socket) -> list[list[bytes]]:  # type: ignore[type-arg]
    """Every message the engine gets until none comes for ``RECEIVE_TIMEOUT_MS``."""
    messages = []
    while True:
        try:
            messages.append(engine.recv_multipart())
        except zmq.Again:
            return messages


def _request_ids(message: list[bytes], abort: bytes) -> list[str] | None:
    """The ids of ``message`` when it is one whole abort as vLLM sends it (type frame, one msgpack list)."""
    if len(message) != 2 or message[0] != abort:
        return None
    try:
        ids = msgspec.msgpack.decode(message[1])
    except msgspec.DecodeError:
        return None
    return ids if isinstance(ids, list) and all(isinstance(i, str) for i in ids) else None


def sends_from_two_threads(per_thread: int = 3, *, handover: bool = True) -> dict[str, Any]:
    """Two threads each send ``per_thread`` aborts through one client at once; what the engine got.

    Returns ``sent`` (every request id), ``received`` (the ids of each whole abort the engine got),
    ``garbled`` (the messages that were not one whole abort, as frame counts and first bytes),
    ``errors`` (what a sender raised, as text) and ``guarded`` (whether the client's input socket
    holds a send lock).
    """
    from vllm.v1.engine import EngineCoreRequestType

    abort = EngineCoreRequestType.ABORT.value
    with client_with_an_engine() as (client, engine):
        plain = client.input_socket._shadow_sock
        if handover:
            object.__setattr__(plain, "send", FrameHandover(plain.send))
        start = threading.Barrier(2, timeout=10)
        errors: list[BaseException] = []
        batches = [[f"{name}-{i}" for i in range(per_thread)] for name in ("left", "right")]
        threads = [threading.Thread(target=_send_aborts, args=(client, batch, start, errors), daemon=True)
                   for batch in batches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        messages = _received(engine)
        guarded = send_lock(client.input_socket) is not None
    received, garbled = [], []
    for message in messages:
        ids = _request_ids(message, abort)
        if ids is None:
            garbled.append([frame[:8] for frame in message])
        else:
            received.extend(ids)
    return {
        "sent": [i for batch in batches for i in batch],
        "received": received,
        "garbled": garbled,
        "errors": [f"{type(error).__name__}: {error}" for error in errors],
        "guarded": guarded,
    }
