"""``vllm.shm_broadcast_bind_retry``: vLLM's own ``MessageQueue`` with a remote reader (a TCP socket) built while
another socket holds the port its probe found free.

vLLM 0.24-0.28 probe a port and bind it later; the rival's bind in between makes the queue fail with
``EADDRINUSE``, which the patch turns into a bind on the next free port, advertised in the handle vLLM's
readers connect to. From 0.29 vLLM binds port 0 itself (native). The race is made certain (see
``_lost_port_race``); every socket binds loopback, every rival port is the kernel's choice, every wait is
bounded.
"""

from __future__ import annotations

from importlib.metadata import version
from urllib.parse import urlsplit

import pytest
import zmq
from packaging.version import Version
from patchkit.patches.vllm import _shm_broadcast_bind_retry
from patchkit.patches.vllm._checks._lost_port_race import (
    queue_after_a_lost_port_race,
    round_trip_after_a_lost_port_race,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason
from patchkit.selfcheck import upstream_behaviour

PATCH = "vllm.shm_broadcast_bind_retry"
pytestmark = pytest.mark.usefixtures("patches_restored")
NATIVE = Version(version("vllm")) >= Version("0.29")
needs_the_probe = pytest.mark.skipif(NATIVE, reason="vLLM binds port 0 from 0.29: no probe to lose (native)")


def _probe_then_bind(monkeypatch):
    """vLLM 0.24-0.28's remote-socket bind put back on a release that binds port 0: the port comes from
    ``shm_broadcast.get_open_port()`` (vLLM's probe), bound afterwards."""
    from vllm.distributed.device_communicators import shm_broadcast
    from vllm.utils.network_utils import get_open_port

    monkeypatch.setattr(shm_broadcast, "get_open_port", get_open_port, raising=False)

    class ProbingSocket(zmq.Socket):
        def bind(self, addr):
            if urlsplit(addr).scheme == "tcp" and addr.endswith(":0"):
                addr = f"{addr[:-2]}:{shm_broadcast.get_open_port()}"
            return super().bind(addr)

    class ProbingContext(zmq.Context):
        _socket_class = ProbingSocket

    monkeypatch.setattr(shm_broadcast, "Context", ProbingContext)


def test_patched_up_to_0_28_and_native_from_0_29():
    with patchkit.applied(PATCH) as (record,):
        if NATIVE:
            assert record.reason is Reason.NATIVE, record.to_dict()
        else:
            assert record.state.installed and record.variant == "retry-bind", record.to_dict()


@needs_the_probe
def test_vllm_alone_fails_with_address_in_use_when_its_probed_port_is_taken():
    """Upstream pinned: the failure the patch exists for."""
    with patchkit.applied(PATCH), upstream_behaviour(PATCH):
        outcome = queue_after_a_lost_port_race()
    assert isinstance(outcome["error"], zmq.ZMQError), outcome
    assert outcome["error"].errno == zmq.EADDRINUSE


@pytest.mark.skipif(not NATIVE, reason="vLLM 0.24-0.28 probe, then bind")
def test_vllm_binds_port_0_and_advertises_the_kernels_choice_itself():
    """Native from 0.29: no patch installed, the queue binds while another socket holds any port its old probe
    would have answered. Fails when vLLM probes again (the next test shows the old shape failing)."""
    with patchkit.applied(PATCH) as (record,):
        assert not record.state.installed
        outcome = queue_after_a_lost_port_race()
    assert outcome["error"] is None, outcome
    assert outcome["reached"], outcome


@pytest.mark.skipif(not NATIVE, reason="vLLM 0.24-0.28 probe, then bind")
def test_the_old_probe_then_bind_put_back_fails_with_address_in_use(monkeypatch):
    """The native test's foil: vLLM's probe-then-bind put back on this release loses the port as 0.24 does."""
    _probe_then_bind(monkeypatch)
    outcome = queue_after_a_lost_port_race()
    assert isinstance(outcome["error"], zmq.ZMQError), outcome
    assert outcome["error"].errno == zmq.EADDRINUSE


def test_a_queue_whose_port_was_taken_binds_another_and_advertises_it(applied):
    outcome = queue_after_a_lost_port_race()
    assert outcome["error"] is None, outcome
    assert not outcome["advertised"].endswith(f":{outcome['lost_port']}"), outcome
    assert urlsplit(outcome["advertised"]).hostname == "127.0.0.1", outcome
    assert outcome["reached"], outcome


def test_vllms_own_reader_gets_a_message_from_a_queue_whose_port_was_taken(applied):
    outcome = round_trip_after_a_lost_port_race({"step": 3, "weights": "ready"})
    assert outcome["error"] is None, outcome
    assert outcome["received"] == {"step": 3, "weights": "ready"}


@needs_the_probe
def test_a_queue_that_loses_every_port_it_tries_raises_address_in_use(applied, monkeypatch):
    """The retry is bounded: when every port vLLM's probe answers is held, the last ``EADDRINUSE`` is raised."""
    from patchkit.patches.vllm._checks._lost_port_race import rival_holding_a_port

    calls = []
    with rival_holding_a_port() as held:
        monkeypatch.setattr(_shm_broadcast_bind_retry, "get_open_port", lambda: calls.append(held) or held)
        outcome = queue_after_a_lost_port_race()
    assert isinstance(outcome["error"], zmq.ZMQError) and outcome["error"].errno == zmq.EADDRINUSE, outcome
    assert len(calls) == _shm_broadcast_bind_retry.BIND_ATTEMPTS - 1


@needs_the_probe
def test_an_ipc_bind_that_fails_is_not_retried(applied, tmp_path, monkeypatch):
    """Only a TCP port is searched again: an ``ipc://`` bind (local readers) that fails raises at once."""
    from vllm.distributed.device_communicators import shm_broadcast

    calls = []
    monkeypatch.setattr(_shm_broadcast_bind_retry, "get_open_port", lambda: calls.append(1) or 0)
    context = shm_broadcast.Context()
    socket = context.socket(zmq.XPUB)
    try:
        with pytest.raises(zmq.ZMQError) as raised:
            socket.bind(f"ipc://{tmp_path}/missing-dir/socket")
    finally:
        socket.close(linger=0)
        context.term()
    assert raised.value.errno != zmq.EADDRINUSE and calls == []


def test_shm_broadcast_bind_retry_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.shm_broadcast_bind_retry")
def test_shm_broadcast_bind_retry_check_fails_with_a_probe_then_bind(applied, monkeypatch):
    """0.24-0.28: vLLM's own code put back; from 0.29 (native): 0.24's probe-then-bind put back."""
    if NATIVE:
        _probe_then_bind(monkeypatch)
        (verdict,) = run([PATCH], device="cpu")[0]
    else:
        with upstream_behaviour(PATCH):
            (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "built while another socket holds the port its probe found free: expected bound, found ZMQError: " \
        "Address already in use" in verdict.message, verdict.message
