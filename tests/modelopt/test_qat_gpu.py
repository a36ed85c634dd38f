"""On CUDA GPUs: QAT under Megatron DDP with ModelOpt's own NVFP4 kernel, called the way verl calls it.

Marked ``gpu``; skipped without CUDA (the two-rank test without two GPUs). Run (repository root):

    python -m pytest -q -p no:cacheprovider -m gpu -rA tests/modelopt/test_qat_gpu.py
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
from _multiprocess import init_rank, rendezvous, single_process_group, spawn_ranks
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import apply_qat, check_weight_calibration, qat_settings
from qat_fixtures import VERL_IGNORE, batch, build_tiny_moe_gpt, wrap_ddp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _start(rank: int, world_size: int, init_method: str | None) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    torch.cuda.set_device(rank)
    if init_method is None:
        single_process_group("nccl")
    else:
        init_rank(rank, world_size, init_method, "nccl")
    parallel_state.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1234)


def _stop() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()


def _qat_step_under_ddp(rank: int, world_size: int) -> None:
    """Framework-style QAT on a DDP chunk, forward/backward, grad sync; compare with bare QAT models."""
    model = build_tiny_moe_gpt(use_cpu_initialization=False, mtp_num_layers=None, bf16=False).cuda()
    reference = build_tiny_moe_gpt(use_cpu_initialization=False, mtp_num_layers=None).cuda()
    reference.load_state_dict(model.state_dict())
    modules = [wrap_ddp(model)]
    ddp = modules[0]
    for i in range(len(modules)):
        modules[i] = apply_qat(modules[i], "w4a16", ignore_patterns=VERL_IGNORE, backend=None)
    assert modules[0] is ddp
    enabled = [m for n, m in model.named_modules() if n.endswith("weight_quantizer") and isinstance(m, TensorQuantizer)
               and m.is_enabled]
    assert len(enabled) == 20 and all(m.backend is None for m in enabled)  # ModelOpt's CUDA kernel
    assert set(check_weight_calibration(ddp)) == set(qat_settings(ddp).quantized)
    inputs = {k: v.cuda() for k, v in batch(seed=rank).items()}
    loss = ddp(**inputs)
    assert torch.isfinite(loss).all()
    loss.mean().backward()
    ddp.finish_grad_sync()

    apply_qat(reference, backend=None)
    expected: dict[str, torch.Tensor] = {}
    for other in range(world_size):
        reference.zero_grad()
        reference(**{k: v.cuda() for k, v in batch(seed=other).items()}).mean().backward()
        for name, p in reference.named_parameters():
            expected[name] = expected.get(name, 0) + p.grad / world_size
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.main_grad, expected[name], rtol=1e-4, atol=1e-6, msg=name)
    assert model.decoder.layers[0].self_attention.linear_qkv.weight.main_grad.abs().sum() > 0


@pytest.fixture
def one_rank() -> Iterator[None]:
    _start(0, 1, None)
    try:
        yield
    finally:
        _stop()


def test_qat_forward_backward_under_ddp_with_modelopts_cuda_kernel(one_rank):
    _qat_step_under_ddp(0, 1)


def _two_rank_worker(rank: int, world_size: int, init_method: str, result_dir: str) -> None:
    _start(rank, world_size, init_method)
    try:
        _qat_step_under_ddp(rank, world_size)
    finally:
        _stop()
    Path(result_dir, f"rank{rank}.ok").write_text("ok")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_qat_forward_backward_under_ddp_on_two_gpus(tmp_path):
    spawn_ranks(_two_rank_worker, 2, (2, rendezvous(tmp_path / "rendezvous"), str(tmp_path)), timeout=600)
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0.ok", "rank1.ok"]
