"""Self-check of ``megatron.chunked_tp_grad_allreduce``: two tensor-parallel ranks (threads with their own
gloo group) all-reduce their layer-norm and averaged gradients through upstream's
``_allreduce_non_tensor_model_parallel_grads``; no all-reduce carries more than the chunk and the
gradients are the sums and means every rank expects."""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ...dist_checkpointing._checks._roundtrip import one_rank_gloo
from .. import _chunked_tp_grad_allreduce as chunked
from ._tp_grads import CHUNK_BYTES, expected_grads, grads, recording_all_reduces, thread_pair, tp_config, tp_model


def reduce_one_rank(rank: int, group: Any) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s gradients after ``finalize_model_grads``' tensor-parallel all-reduce (the
    function looked up in its module, as ``finalize_model_grads`` calls it)."""
    import importlib

    # The package's ``finalize_model_grads`` attribute is the function of that name, not the module.
    module = importlib.import_module("megatron.core.distributed.finalize_model_grads")
    model = tp_model(rank)
    module._allreduce_non_tensor_model_parallel_grads(model, tp_config(), group)
    return grads(model)


def check_chunked_tp_grad_allreduce(context: CheckContext) -> None:
    """With a 256-byte chunk, every all-reduce of two ranks carries at most 256 bytes (upstream's one
    per op carries all of them) and each rank's gradients equal the expected sums and means."""
    chunked.configure_chunk_bytes(CHUNK_BYTES)
    try:
        with one_rank_gloo(), recording_all_reduces() as carried:
            outcomes = thread_pair(reduce_one_rank)
    finally:
        chunked.configure_chunk_bytes(None)
    expect(bool(carried) and max(carried) <= CHUNK_BYTES,
           f"no all-reduce of either rank carries more than the {CHUNK_BYTES}-byte chunk",
           f"<= {CHUNK_BYTES} bytes each", carried)
    for rank, reduced in enumerate(outcomes):
        wrong = sorted(name for name, grad in expected_grads(rank).items()
                       if not torch.allclose(reduced[name], grad, rtol=1e-6, atol=1e-6))
        expect(not wrong, f"rank {rank}: every gradient is the tensor-parallel sum or mean", "none differs", wrong)
