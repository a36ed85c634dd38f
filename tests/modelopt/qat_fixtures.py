"""Fixtures and helpers for QAT tests against the real nvidia-modelopt and megatron-core on CPU.

Shared by ``tests/modelopt`` and ``tests/bridge`` (their conftests import it).

Megatron runs through ``tests/megatron/cpu_harness.py`` (CUDA-only device and RNG calls redirected;
see its docstring). MoE layers additionally need one redirect on megatron-core 0.16.1, whose
``moe_utils`` refers to ``te_general_gemm`` without defining it when TransformerEngine is absent:
the name is set to ``None`` (what TE-less releases define) for the duration of a test.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "megatron"))
from cpu_harness import (  # noqa: E402,F401
    cpu_megatron,
    destroy_parallel_state,
    initialize_parallel_state,
    megatron_state_on_cpu,
)

# The grid check is shipped: the ModelOpt self-check judges NVFP4 output with the same code.
from patchkit.patches.modelopt.qat._checks._nvfp4_grid import E2M1, assert_blocks_on_fp4_grid  # noqa: E402,F401

VOCAB_SIZE = 128
SEQ_LEN = 16


@pytest.fixture
def megatron_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Megatron parallel state (TP=PP=EP=1) on a one-rank gloo group, CUDA-only calls redirected."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    with megatron_state_on_cpu():
        yield


def build_tiny_moe_gpt(mtp_num_layers: int | None = 1, num_experts: int = 4, seed: int = 0, **overrides: Any):
    """A 2-layer hidden-64 GPT with a 4-expert SequentialMLP MoE and an MTP layer, local specs."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig

    kwargs: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0,
        num_moe_experts=num_experts, moe_router_topk=2, add_bias_linear=False,
        mtp_num_layers=mtp_num_layers, params_dtype=torch.float32,
        # megatron-core 0.15 defaults this to None and then divides by it; 0.16+ default 0.1.
        mtp_loss_scaling_factor=0.1,
    )
    kwargs.update(overrides)
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if mtp_num_layers else None
    torch.manual_seed(seed)
    return GPTModel(config, spec, vocab_size=VOCAB_SIZE, max_sequence_length=SEQ_LEN, mtp_block_spec=mtp_spec)


def build_te_gpt(num_experts: int | None, **overrides: Any) -> Any:
    """A 2-layer hidden-64 GPT on megatron-core's TransformerEngine spec, on the GPU: dense, or with
    ``num_experts`` SequentialMLP experts (top-2) and an MTP layer. ``overrides`` go to its
    ``TransformerConfig`` (fp32 parameters unless they say otherwise)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_with_transformer_engine_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer import TransformerConfig

    kwargs: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, hidden_dropout=0.0,
        attention_dropout=0.0, num_moe_experts=num_experts, moe_router_topk=2 if num_experts else None,
        add_bias_linear=False, mtp_num_layers=1 if num_experts else None, mtp_loss_scaling_factor=0.1,
        params_dtype=torch.float32,
    )
    kwargs.update(overrides)
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_with_transformer_engine_spec(num_experts=num_experts, moe_grouped_gemm=False)
    mtp = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=True) if num_experts else None
    torch.manual_seed(0)
    return GPTModel(config, spec, vocab_size=VOCAB_SIZE, max_sequence_length=SEQ_LEN, mtp_block_spec=mtp).cuda()


@pytest.fixture
def tiny_moe_gpt(megatron_cpu: None) -> Callable[..., Any]:
    return build_tiny_moe_gpt


@pytest.fixture
def cpu_backend() -> Iterator[None]:
    """The opt-in CPU fake-quant backend, applied through patchkit for the test and reverted after."""
    import patchkit

    with patchkit.applied("modelopt.nvfp4_cpu_fake_quant") as records:
        assert [r.state.value for r in records] == ["applied"], records
        yield


def batch(seed: int = 3) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (2, SEQ_LEN + 1), generator=generator)
    return {
        "input_ids": tokens[:, :-1].contiguous(),
        "position_ids": torch.arange(SEQ_LEN).expand(2, SEQ_LEN).contiguous(),
        "attention_mask": torch.ones(SEQ_LEN, SEQ_LEN, dtype=torch.bool).triu(1).view(1, 1, SEQ_LEN, SEQ_LEN),
        "labels": tokens[:, 1:].contiguous(),
    }


# --- Megatron DDP on CPU (gloo) -----------------------------------------------------------------

#: What ``*output_layer*``/``*router*`` look like in verl's QAT config (already Megatron names).
VERL_IGNORE = ["*output_layer*", "*router*"]


def wrap_ddp(model: Any) -> Any:
    """Megatron-core's real DistributedDataParallel around ``model`` (default config: all-reduce, fp32 grads)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    return DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)


def fake_quant_weights(model: Any) -> dict[str, torch.Tensor]:
    """Every enabled weight quantizer's output on its weight, by module name (what QAT trains against)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    out = {}
    for name, module in model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if isinstance(quantizer, TensorQuantizer) and quantizer.is_enabled:
            with torch.no_grad():
                out[name] = quantizer(module.weight).detach().clone()
    return out


def ddp_world_worker(rank: int, world_size: int, init_method: str, result_dir: str) -> None:
    """One rank of a gloo world: DDP-wrapped tiny GPT, QAT the framework way, forward/backward, grad sync.

    Checks on every rank: the caller's DDP object comes back, parameters are DDP's (same objects),
    ``main_grad`` after ``finish_grad_sync`` equals the mean over ranks of a bare QAT model's
    gradients for each rank's batch (computed locally), and the fake-quant weights agree across ranks.
    Writes ``rank<N>.ok`` when all passed.
    """
    # A spawned rank runs no conftest: load ModelOpt's Megatron plugin as tests/modelopt/conftest.py
    # does (ModelOpt 0.48 needs TransformerEngine for it; tests/te_harness.py).
    from te_harness import load_modelopt_megatron_plugin

    load_modelopt_megatron_plugin()

    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.moe import moe_utils
    from patchkit.patches.modelopt.qat import apply_qat

    import patchkit

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    from _multiprocess import init_rank

    with cpu_megatron(), patchkit.applied("modelopt.nvfp4_cpu_fake_quant"):
        init_rank(rank, world_size, init_method)
        try:
            parallel_state.initialize_model_parallel()
            model_parallel_cuda_manual_seed(1234)
            assert parallel_state.get_data_parallel_world_size() == world_size
            model = build_tiny_moe_gpt(mtp_num_layers=None)
            modules = [wrap_ddp(model)]
            ddp = modules[0]
            params_before = [id(p) for p in model.parameters()]
            for i in range(len(modules)):  # verl's apply_qat_to_modules loop
                modules[i] = apply_qat(modules[i], "w4a16", ignore_patterns=VERL_IGNORE)
            assert modules[0] is ddp and [id(p) for p in model.parameters()] == params_before
            loss = ddp(**batch(seed=rank))
            loss.mean().backward()
            ddp.finish_grad_sync()

            expected: dict[str, torch.Tensor] = {}
            for other in range(world_size):
                reference = build_tiny_moe_gpt(mtp_num_layers=None)
                apply_qat(reference)
                reference(**batch(seed=other)).mean().backward()
                for name, p in reference.named_parameters():
                    expected[name] = expected.get(name, 0) + p.grad / world_size
            for name, p in model.named_parameters():
                torch.testing.assert_close(p.main_grad, expected[name], rtol=1e-5, atol=1e-6, msg=name)
            qkv = "decoder.layers.0.self_attention.linear_qkv"
            assert model.get_submodule(qkv).weight.main_grad.abs().sum() > 0
            mine = torch.cat([w.flatten() for w in fake_quant_weights(model).values()])
            gathered = [torch.empty_like(mine) for _ in range(world_size)]
            torch.distributed.all_gather(gathered, mine)
            assert all(torch.equal(g, mine) for g in gathered)
        finally:
            parallel_state.destroy_model_parallel()
            torch.distributed.destroy_process_group()
    Path(result_dir, f"rank{rank}.ok").write_text("ok")


def mtp_inner(model: Any) -> str:
    """The MTP layer's inner layer prefix: megatron-core 0.17 renamed ``transformer_layer`` (0.14-0.16)
    to ``mtp_model_layer``."""
    inner = "mtp_model_layer" if hasattr(model.mtp.layers[0], "mtp_model_layer") else "transformer_layer"
    return f"mtp.layers.0.{inner}"
