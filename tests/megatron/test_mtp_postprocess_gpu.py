"""The key MTP postprocess checks on a CUDA GPU: same tiny model, no CPU harness, NCCL world of one.

Run on a GPU machine with ``-m gpu``; skipped cleanly elsewhere.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from mtp_checks import (
    assert_all_gradients_finite,
    assert_attached_mtp_losses_match_upstream,
    assert_output_head_untouched_and_mtp_trains,
    assert_trainer_gradients_match_upstream,
    grad_magnitude,
    mtp_only_backward,
    run,
    token_loss_from_logits,
)
from tiny_gpt import VOCAB_SIZE, Batch, build_tiny_gpt, make_batch

import patchkit

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("empty_mtp_tracker")]


def cuda_batch() -> Batch:
    batch = make_batch()
    return Batch(**{f.name: getattr(batch, f.name).cuda() for f in dataclasses.fields(Batch)})


def cuda_model(mtp_num_layers: int, **overrides: Any) -> Any:
    return build_tiny_gpt(mtp_num_layers=mtp_num_layers, **overrides).cuda()


@pytest.mark.parametrize("calculate_per_token_loss", [False, True])
@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_gpu_attached_mtp_losses_equal_upstreams_and_logits_are_batch_major(
    megatron_gpu: None,
    attached_mtp_losses: list[torch.Tensor],
    mtp_num_layers: int,
    calculate_per_token_loss: bool,
) -> None:
    model = cuda_model(mtp_num_layers, calculate_per_token_loss=calculate_per_token_loss)
    batch = cuda_batch()
    assert_attached_mtp_losses_match_upstream(model, batch, attached_mtp_losses, mtp_num_layers)
    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
    assert logits.is_cuda and logits.shape == (*batch.labels.shape, VOCAB_SIZE)


@pytest.mark.parametrize("head", ["trained", "detached"])
@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_gpu_trainer_loss_on_patched_logits_gives_upstreams_gradients(
    megatron_gpu: None, mtp_num_layers: int, head: str
) -> None:
    assert_trainer_gradients_match_upstream(cuda_model(mtp_num_layers), cuda_batch(), head=head)


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_gpu_mtp_loss_leaves_output_head_alone_by_default(megatron_gpu: None, mtp_num_layers: int) -> None:
    model = cuda_model(mtp_num_layers)
    with patchkit.applied("megatron.mtp_postprocess"):
        mtp_only_backward(model, cuda_batch())
    assert_output_head_untouched_and_mtp_trains(model)


def test_gpu_all_zero_loss_mask_gives_finite_gradients(megatron_gpu: None) -> None:
    model = cuda_model(2)
    batch = dataclasses.replace(cuda_batch(), loss_mask=torch.zeros(2, 16, device="cuda"))
    with patchkit.applied("megatron.mtp_postprocess"):
        loss = (token_loss_from_logits(model, batch, run(model, batch)) * batch.loss_mask).sum()
        loss.backward()
    assert torch.isfinite(loss)
    assert_all_gradients_finite(model)


def test_gpu_enable_per_model_leaves_the_reference_model_upstream(megatron_gpu: None) -> None:
    from patchkit.patches.megatron import mtp

    batch = cuda_batch()
    policy, reference = cuda_model(1), cuda_model(1, seed=1)
    upstream_loss = run(reference, batch).detach()
    mtp.enable(policy)
    (run(policy, batch) * 0.0).sum().backward()
    assert_output_head_untouched_and_mtp_trains(policy)
    assert torch.equal(run(reference, batch).detach(), upstream_loss)
    (run(reference, batch) * 0.0).sum().backward()
    assert grad_magnitude(reference.output_layer.weight) > 0


def test_gpu_detach_patch_sends_no_mtp_gradient_into_the_embedding(megatron_gpu: None) -> None:
    model = cuda_model(1)
    batch = cuda_batch()
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        (run(model, batch) * 0.0).sum().backward()
    embedding_grad = model.embedding.word_embeddings.weight.grad
    assert embedding_grad is None or float(embedding_grad.abs().sum()) == 0.0
    mtp_grads = [p.grad for n, p in model.named_parameters() if n.startswith("mtp.")]
    assert mtp_grads and all(g is not None and float(g.abs().sum()) > 0 for g in mtp_grads)
