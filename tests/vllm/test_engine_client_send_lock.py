"""``vllm.engine_client_send_lock``: two threads sending through one vLLM ``AsyncMPClient`` at once.

The client is vLLM's own (engines managed elsewhere), the engine this process on a ZMQ ``DEALER``; the
senders go through ``abort_requests_async``, vLLM's send path, from two event loops in two threads, and
a frame handover makes their frames interleave wherever nothing stops them (see ``_concurrent_sends``).
No release from 0.24 to 0.33 guards the socket: the patch is installed on each.
"""

from __future__ import annotations

import threading

import pytest
import zmq
from patchkit.patches.vllm._checks._concurrent_sends import client_with_an_engine, sends_from_two_threads
from patchkit.patches.vllm._engine_client_send_lock import guard_sends, send_lock

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

PATCH = "vllm.engine_client_send_lock"
pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.fixture
def applied():
    with patchkit.applied(PATCH) as (record,):
        assert record.state.installed and record.variant == "locked-input-sends", record.to_dict()
        yield record


def _whole(outcome):
    return not outcome["errors"] and not outcome["garbled"] and sorted(outcome["received"]) == sorted(outcome["sent"])


def test_vllm_alone_interleaves_two_threads_frames():
    """Upstream pinned: the failure the patch exists for. The engine gets messages mixing both threads'
    frames, and not every abort whole."""
    with patchkit.applied(PATCH), upstream_behaviour(PATCH):
        outcome = sends_from_two_threads()
    assert not outcome["guarded"], outcome
    assert outcome["garbled"], outcome
    assert sorted(outcome["received"]) != sorted(outcome["sent"]), outcome


def test_two_threads_aborts_reach_the_engine_whole(applied):
    outcome = sends_from_two_threads()
    assert outcome["guarded"], outcome
    assert _whole(outcome), outcome


def test_many_sends_from_two_threads_without_a_handover_reach_the_engine_whole(applied):
    """The threads left to the interpreter's own switching (no handover), many sends each."""
    outcome = sends_from_two_threads(per_thread=200, handover=False)
    assert _whole(outcome), outcome


def test_the_lock_is_on_the_clients_input_socket_only(applied):
    with client_with_an_engine() as (client, _engine):
        assert send_lock(client.input_socket) is not None
        assert send_lock(client.resources.output_socket) is None
        other = zmq.Context.instance().socket(zmq.PUSH)
        try:
            assert "send_multipart" not in other.__dict__
        finally:
            other.close(linger=0)


def test_a_send_made_while_the_lock_is_held_waits_for_it(applied):
    """The lock covers the whole ``send_multipart``: another thread's send waits until it is released."""
    with client_with_an_engine() as (client, engine):
        lock = send_lock(client.input_socket)
        sent = threading.Event()

        def send():
            client.input_socket._shadow_sock.send_multipart([client.core_engine, b"\x01", b"\x91\xa1x"])
            sent.set()

        with lock:
            thread = threading.Thread(target=send, daemon=True)
            thread.start()
            assert not sent.wait(0.2)
        assert sent.wait(5)
        thread.join(5)
        assert engine.recv_multipart() == [b"\x01", b"\x91\xa1x"]


def test_guarding_a_socket_twice_keeps_one_lock(applied):
    with client_with_an_engine() as (client, _engine):
        first = send_lock(client.input_socket)
        guard_sends(client.input_socket)
        assert send_lock(client.input_socket) is first


def test_engine_client_send_lock_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.engine_client_send_lock")
def test_engine_client_send_lock_check_fails_with_vllms_unguarded_socket(applied):
    with upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "messages the engine received with frames of two requests: expected none" in verdict.message, \
        verdict.message
