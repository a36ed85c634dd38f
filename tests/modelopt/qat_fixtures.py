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
from cpu_harness import cpu_megatron, destroy_parallel_state, initialize_parallel_state  # noqa: E402

# The grid check is shipped: the ModelOpt self-check judges NVFP4 output with the same code.
from patchkit.patches.modelopt._nvfp4_grid import E2M1, assert_blocks_on_fp4_grid  # noqa: E402,F401

VOCAB_SIZE = 128
SEQ_LEN = 16


@pytest.fixture
def megatron_cpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Megatron parallel state (TP=PP=EP=1) on a one-rank gloo group, CUDA-only calls redirected."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        monkeypatch.setattr(moe_utils, "te_general_gemm", None, raising=False)
    with cpu_megatron():
        initialize_parallel_state()
        try:
            yield
        finally:
            destroy_parallel_state()


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
