"""The CPU harness runs upstream's tiny GPT with MTP end to end and leaves nothing behind."""

from __future__ import annotations

import torch
from cpu_harness import cpu_megatron


def _redirected_calls() -> tuple[object, ...]:
    """The CUDA-only calls the harness redirects, as they are now."""
    from megatron.core.tensor_parallel import random as megatron_random

    return (torch.cuda.current_device, torch.cuda.get_rng_state, torch.cuda.manual_seed, torch.cuda.current_stream,
            megatron_random._get_cuda_rng_state, megatron_random._set_cuda_rng_state)


def test_harness_restores_redirected_cuda_calls() -> None:
    before = _redirected_calls()
    with cpu_megatron():
        assert torch.cuda.current_device() == "cpu"
    assert _redirected_calls() == before


def test_tiny_gpt_with_mtp_trains_every_parameter_on_cpu(tiny_gpt, batch, empty_mtp_tracker) -> None:
    # empty_mtp_tracker: megatron-core's MTP loss tracker is global; a 1-depth MTP model built earlier in
    # the process (tests/modelopt) leaves it sized for one layer.
    model = tiny_gpt(mtp_num_layers=2)
    loss = model(
        batch.input_ids,
        batch.position_ids,
        batch.attention_mask,
        labels=batch.labels,
        loss_mask=batch.loss_mask,
    )
    assert loss.shape == batch.labels.shape
    (loss * batch.loss_mask).sum().backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_tiny_gpt_is_deterministic_for_a_seed(tiny_gpt) -> None:
    first = tiny_gpt(mtp_num_layers=1, seed=3).state_dict()
    second = tiny_gpt(mtp_num_layers=1, seed=3).state_dict()
    assert first.keys() == second.keys()
    for key, value in first.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, second[key]), key


def test_megatron_ddp_grad_sync_runs_on_cpu(tiny_gpt, batch, empty_mtp_tracker) -> None:
    """Megatron's real DDP: ``finish_grad_sync`` fills ``main_grad`` with the bare model's gradients.

    megatron-core 0.19+ takes ``torch.cuda.current_stream()`` in every grad sync (CUDA-graph events);
    without the harness's stream stand-in this raises "Found no NVIDIA driver" on a CPU.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    def loss_of(model):
        out = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                    loss_mask=batch.loss_mask)
        return (out * batch.loss_mask).sum()

    reference = tiny_gpt(mtp_num_layers=1, seed=5)
    loss_of(reference).backward()
    model = tiny_gpt(mtp_num_layers=1, seed=5)
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    loss_of(ddp).backward()
    ddp.finish_grad_sync()
    grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.main_grad, grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)
