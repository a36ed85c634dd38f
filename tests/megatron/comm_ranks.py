"""Ranks of the gradient- and pipeline-communication tests (``tests/_multiprocess.spawn_ranks``, gloo on CPU).

Each runs upstream's code first, then the same communication with the patch applied, and reports both."""

from __future__ import annotations

import contextlib
import importlib

import torch

CHUNKED_ID = "megatron.chunked_tp_grad_allreduce"


def chunked_allreduce_rank(rank: int, world_size: int, init_method: str, chunk_bytes: int
                           ) -> tuple[bool, bool, list[int], list[int]]:
    """One rank of a two-rank tensor-parallel gradient all-reduce: upstream's unchunked all-reduce,
    then the same gradients through the chunked patch.

    Reports whether the patched gradients equal upstream's bit for bit and the expected sums and
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
            with patchkit.applied(CHUNKED_ID), recording_all_reduces() as patched:
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


P2P_ID = "megatron.pipeline_p2p_default_group"


def pipeline_p2p_rank(rank: int, world_size: int, init_method: str) -> dict[str, tuple[list[float], list[str]]]:
    """One stage of a two-stage pipeline on its own group (``new_group``, not the default group):
    stage 0 sends an activation forward and receives a gradient back, stage 1 the other way round,
    with ``variable_seq_lengths`` (shapes exchanged first), through upstream's ``P2PCommunicator``.

    Reports, for upstream and for the patch, what the stage received and the group of every batched
    op, ``"default"`` or ``"other"``."""
    from _multiprocess import init_rank
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from patchkit.patches.megatron.dist_checkpointing._checks._roundtrip import without_cuda
    from patchkit.patches.megatron.distributed._checks.pipeline_p2p_default_group import (
        SHAPE,
        ops_groups,
        pipeline_config,
        recording_batched_p2p,
    )

    import patchkit

    init_rank(rank, world_size, init_method)
    try:
        pipeline_group = torch.distributed.new_group([0, 1])
        communicator = P2PCommunicator(pipeline_group, pipeline_config(variable_seq_lengths=True))
        sent = torch.full(SHAPE, float(rank + 1))
        outcome = {}
        for name, context in (("upstream", contextlib.nullcontext()), ("patched", patchkit.applied(P2P_ID))):
            with context, without_cuda(), recording_batched_p2p() as ops:
                recv_prev, recv_next, _ = communicator._communicate(
                    tensor_send_next=sent if rank == 0 else None, tensor_send_prev=sent if rank == 1 else None,
                    recv_prev=rank == 1, recv_next=rank == 0, tensor_shape=SHAPE)
            received = recv_next if rank == 0 else recv_prev
            outcome[name] = (received.flatten().tolist(), ops_groups(ops))
        return outcome
    finally:
        torch.distributed.destroy_process_group()
