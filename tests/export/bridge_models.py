"""A tiny Qwen3 (dense or MoE) built through Megatron-Bridge's own provider.

``AutoBridge.from_hf_config`` reads a Hugging Face config (no weights, no network); its provider
builds the Megatron model. ``build`` (CPU): the local layer spec instead of TransformerEngine's,
fusions off, the all-gather token dispatcher (the all-to-all one creates a CUDA stream), CPU
initialisation. ``build_te`` (CUDA, a real TransformerEngine): TransformerEngine's layer spec, whose
``TELayerNormColumnParallelLinear`` holds the input and pre-MLP layer norms. Megatron-Bridge is
imported inside ``te_stub``'s import context (a real TransformerEngine, when installed, is used).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bridge"))
from te_stub import bridge_import_context  # noqa: E402

with bridge_import_context():
    import megatron.bridge  # noqa: F401
    import megatron.bridge.models.conversion.model_bridge  # noqa: F401
    from megatron.bridge import AutoBridge

logger = logging.getLogger(__name__)


def hf_config(moe: bool):
    from transformers import Qwen3Config, Qwen3MoeConfig

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=False,
                  dtype="bfloat16")
    if moe:
        return Qwen3MoeConfig(moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
                              architectures=["Qwen3MoeForCausalLM"], **common)
    return Qwen3Config(architectures=["Qwen3ForCausalLM"], **common)


def build(moe: bool, seed: int = 0, *, dtype: torch.dtype = torch.bfloat16):
    """``(bridge, model)`` on CPU, local layer spec; call with Megatron's parallel state initialised."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(num_experts=4 if moe else None, moe_grouped_gemm=False, qk_layernorm=True)
    return _provide(moe, spec, seed, dtype=dtype, cpu=True)


def build_te(moe: bool, seed: int = 0, *, dtype: torch.dtype = torch.bfloat16):
    """``(bridge, model)`` on the current CUDA device, TransformerEngine's layer spec (experts as a
    ``SequentialMLP``, as ModelOpt quantizes and exports them); needs a real TransformerEngine."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    spec = get_gpt_layer_with_transformer_engine_spec(num_experts=4 if moe else None, moe_grouped_gemm=False,
                                                      qk_layernorm=True)
    bridge, model = _provide(moe, spec, seed, dtype=dtype, cpu=False)
    # provide() left some of the MoE model's parameters on the CPU (H100, megatron-core 0.19.2, Bridge
    # 0.6.2); Megatron's get_model and Bridge's provide_distributed_model move the model with .cuda().
    on_cpu = sorted(n for n, p in model.named_parameters() if p.device.type == "cpu")
    if on_cpu:
        logger.warning("provide() left on the CPU: %s", on_cpu)
    return bridge, model.cuda()


def _provide(moe: bool, spec, seed: int, *, dtype: torch.dtype, cpu: bool):
    from megatron.core.process_groups_config import ProcessGroupCollection

    bridge = AutoBridge.from_hf_config(hf_config(moe))
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.transformer_layer_spec = spec
    for flag in ("moe_grouped_gemm", "moe_permute_fusion", "gradient_accumulation_fusion", "bias_activation_fusion",
                 "masked_softmax_fusion", "persist_layer_norm", "apply_rope_fusion", "bias_dropout_fusion"):
        setattr(provider, flag, False)
    provider.moe_token_dispatcher_type = "allgather"
    provider.use_cpu_initialization = cpu
    provider.params_dtype = dtype
    provider.finalize()
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    torch.manual_seed(seed)
    return bridge, provider.provide()
