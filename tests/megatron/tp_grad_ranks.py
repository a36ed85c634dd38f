"""One rank of a two-rank tensor-parallel gradient all-reduce (``tests/_multiprocess.spawn_ranks``, gloo
on CPU): upstream's unchunked all-reduce, then the same gradients through the chunked patch."""

from __future__ import annotations

import importlib

import torch

PATCH_ID = "megatron.chunked_tp_grad_allreduce"


def chunked_allreduce_rank(rank: int, world_size: int, init_method: str, chunk_bytes: int
                           ) -> tuple[bool, bool, list[int], list[int]]:
    """Reports whether the patched gradients equal upstream's bit for bit and the expected sums and
    means, and the bytes of every all-reduce upstream and the patch ran."""
    from _multiprocess import init_rank
    from patchkit.patches.megatron.distributed import _chunked_tp_grad_allreduce as chunked
    from patchkit.patches.megatron.distributed._checks._tp_grads import (
        expected_grads,
        grads,
        recording_all_reduces,
        tp_config,
        tp_model,
    )

    import patchkit

    init_rank(rank, world_size, init_method)
    try:
        # The package's ``finalize_model_grads`` attribute is the function of that name, not the module.
        module = importlib.import_module("megatron.core.distributed.finalize_model_grads")
        group = torch.distributed.group.WORLD
        upstream_model, patched_model = tp_model(rank), tp_model(rank)
        with recording_all_reduces() as upstream:
            module._allreduce_non_tensor_model_parallel_grads(upstream_model, tp_config(), group)
        chunked.configure_chunk_bytes(chunk_bytes)
        try:
            with patchkit.applied(PATCH_ID), recording_all_reduces() as patched:
                module._allreduce_non_tensor_model_parallel_grads(patched_model, tp_config(), group)
        finally:
            chunked.configure_chunk_bytes(None)
        ours, theirs = grads(patched_model), grads(upstream_model)
        equal = ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in ours)
        expected = all(torch.allclose(ours[name], grad, rtol=1e-6, atol=1e-6)
                       for name, grad in expected_grads(rank).items())
        return equal, expected, upstream, patched
    finally:
        torch.distributed.destroy_process_group()
