"""Self-checks of the Megatron-Core patches: each builds upstream's own tiny model and tests the behaviour.

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by the tests in ``tests/megatron``.
On a CPU, Megatron's CUDA-only calls are redirected for the duration of the check
(:mod:`._cpu_stand_in`); on a GPU the model runs there. Megatron's parallel state is started for the
check (one rank) unless the process already has one, and torn down afterwards if the check started it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ._tiny_gpt import BATCH_SIZE, SEQ_LEN, VOCAB_SIZE, build_tiny_gpt, make_batch


@contextlib.contextmanager
def megatron_on(device: str) -> Iterator[None]:
    """Megatron parallel state (TP=PP=CP=1) on a one-rank group, on ``device``."""
    from megatron.core import parallel_state

    from ._cpu_stand_in import cpu_megatron, destroy_parallel_state, initialize_parallel_state

    with cpu_megatron() if device == "cpu" else contextlib.nullcontext():
        started = not parallel_state.model_parallel_is_initialized()
        if started:
            if device == "cuda" and not torch.distributed.is_initialized():
                _start_nccl_group()
            initialize_parallel_state()
        try:
            yield
        finally:
            if started:
                destroy_parallel_state()


def _start_nccl_group() -> None:
    import os

    from ._cpu_stand_in import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    torch.cuda.set_device(0)
    torch.distributed.init_process_group(backend="nccl", rank=0, world_size=1)


def _forward(model: Any, batch: Any, labels: bool = True) -> torch.Tensor:
    return model(batch.input_ids, batch.position_ids, batch.attention_mask,
                 labels=batch.labels if labels else None, loss_mask=batch.loss_mask)


def check_mtp_postprocess(context: CheckContext) -> None:
    """Forward with labels returns main-head logits, and the MTP layers still get gradient."""
    with megatron_on(context.device):
        model = build_tiny_gpt(mtp_num_layers=1).to(context.device)
        output = _forward(model, make_batch().to(context.device))
        expected = (BATCH_SIZE, SEQ_LEN, VOCAB_SIZE)
        expect(tuple(output.shape) == expected, "GPTModel.forward(labels=...) returns main-head logits "
               "[batch, seq, vocab] when MTP is on", expected, tuple(output.shape))
        # Zero times the logits: only the MTP loss attached to the output carries gradient.
        (output.float().sum() * 0).backward()
        mtp_grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("mtp.")}
        moved = sorted(n for n, g in mtp_grads.items() if g is not None and bool(g.abs().sum() > 0))
        expect(bool(moved), "the MTP layers get gradient from the attached MTP loss",
               f"nonzero gradient in {len(mtp_grads)} MTP parameters", "none")


def check_mtp_detach_inputs(context: CheckContext) -> None:
    """The MTP loss sends no gradient into the embedding: it equals the one without any MTP loss."""
    with megatron_on(context.device):
        batch = make_batch().to(context.device)
        grads = []
        for scale in (0.1, 0.0):  # the same weights, with and without an MTP loss
            model = build_tiny_gpt(mtp_num_layers=1, mtp_loss_scaling_factor=scale).to(context.device)
            output = _forward(model, batch)
            # With the postprocess patch the output is logits; either way only its sum matters.
            output.float().sum().backward()
            grads.append(model.embedding.word_embeddings.weight.grad.detach().clone())
        difference = float((grads[0] - grads[1]).abs().max())
        expect(difference <= 1e-6, "the MTP loss leaves the embedding's gradient unchanged (max difference)",
               "<= 1e-6", f"{difference:.3g}")


def check_swiglu_singleton_local_shards(context: CheckContext) -> None:
    """Native: megatron-core's swiglu sharded-state factory accepts ``singleton_local_shards``."""
    from megatron.core.transformer.mlp import apply_swiglu_sharded_factory

    from patchkit.runtime.probing import accepts_parameter

    expect(accepts_parameter(apply_swiglu_sharded_factory, "singleton_local_shards"),
           "apply_swiglu_sharded_factory takes singleton_local_shards", "the parameter", "no such parameter")
