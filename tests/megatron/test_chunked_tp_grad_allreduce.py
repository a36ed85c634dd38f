"""``megatron.chunked_tp_grad_allreduce``: the tensor-parallel all-reduce of ``finalize_model_grads`` in
chunks of bounded size, on two real gloo ranks (processes meeting through a file store, and the
self-check's two threads)."""

from __future__ import annotations

import pytest
from _multiprocess import rendezvous, spawn_ranks
from comm_ranks import CHUNKED_ID as PATCH_ID
from comm_ranks import chunked_allreduce_rank
from patchkit.patches.megatron.distributed import _chunked_tp_grad_allreduce as chunked
from patchkit.patches.megatron.distributed._checks import chunked_tp_grad_allreduce as check

import patchkit
from patchkit.runtime import settings
from patchkit.selfcheck import CheckContext, SelfCheckFailed, upstream_behaviour

#: One layer's reduced gradients at most (see ``_checks/_tp_grads.py``).
CHUNK = 256


def test_two_ranks_get_upstreams_gradients_with_no_all_reduce_over_the_chunk(tmp_path) -> None:
    outcome = spawn_ranks(chunked_allreduce_rank, 2, (2, rendezvous(tmp_path), CHUNK), timeout=300)
    for equal, expected, upstream, patched in outcome:
        assert equal and expected
        assert max(upstream) > CHUNK  # upstream coalesces each op's gradients into one all-reduce
        assert len(patched) > len(upstream) and max(patched) <= CHUNK, patched
        assert sum(patched) == sum(upstream)  # every reduced gradient once, nothing else


def test_a_chunk_larger_than_every_gradient_keeps_upstreams_all_reduces(tmp_path) -> None:
    default = settings.DEFAULT_GRAD_ALLREDUCE_CHUNK_BYTES
    outcome = spawn_ranks(chunked_allreduce_rank, 2, (2, rendezvous(tmp_path), default), timeout=300)
    for equal, expected, upstream, patched in outcome:
        assert equal and expected and patched == upstream


@pytest.mark.breaks("megatron.chunked_tp_grad_allreduce")
def test_the_self_check_bounds_every_all_reduce_and_fails_on_upstream() -> None:
    with patchkit.applied(PATCH_ID) as statuses:
        assert [status.state.value for status in statuses] == ["applied"]
        check.check_chunked_tp_grad_allreduce(CheckContext(PATCH_ID))
        with upstream_behaviour(PATCH_ID), pytest.raises(SelfCheckFailed, match="256-byte chunk"):
            check.check_chunked_tp_grad_allreduce(CheckContext(PATCH_ID))


def test_the_patch_is_opt_in() -> None:
    from patchkit.patches.megatron.distributed import chunked_tp_grad_allreduce

    assert chunked_tp_grad_allreduce.PATCHES[0].opt_in


def test_the_chunk_comes_from_the_environment_unless_configured(monkeypatch) -> None:
    monkeypatch.setenv(settings.GRAD_ALLREDUCE_CHUNK_BYTES, "4096")
    assert chunked.chunk_bytes() == 4096
    chunked.configure_chunk_bytes(512)
    try:
        assert chunked.chunk_bytes() == 512
    finally:
        chunked.configure_chunk_bytes(None)
    monkeypatch.setenv(settings.GRAD_ALLREDUCE_CHUNK_BYTES, "-1")
    assert chunked.chunk_bytes() == settings.DEFAULT_GRAD_ALLREDUCE_CHUNK_BYTES
    with pytest.raises(ValueError, match="positive"):
        chunked.configure_chunk_bytes(0)
