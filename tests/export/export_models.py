"""Tiny QAT Megatron GPTs for the export tests, and the shard of a full state a parallel rank holds.

Dense and MoE (SequentialMLP experts, what ModelOpt quantizes) with SwiGLU, local (non-TE) specs,
untied embeddings, float32 or bf16. ``apply_qat`` runs through patchkit with the CPU fake-quant
backend, so the trainer's fake-quantized weight is available on CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

VOCAB = 128
SEQ = 16
#: The two-rank layouts every distributed export test runs (on gloo ranks and on two GPUs): the
#: parallel sizes ``dist_worker.run`` builds the model with, and whether it has MoE layers.
PARALLEL_LAYOUTS: dict[str, tuple[dict[str, int], bool]] = {
    "tp2-moe": ({"tp": 2}, True),
    "tp2-dense": ({"tp": 2}, False),
    "ep2-moe": ({"ep": 2}, True),
    "pp2-moe": ({"pp": 2}, True),
}


def build_gpt(moe: bool, *, mtp: bool = False, dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import TransformerConfig

    kwargs: dict[str, Any] = dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4, num_query_groups=2,
        use_cpu_initialization=True, hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=False,
        gated_linear_unit=True, params_dtype=dtype, bf16=dtype == torch.bfloat16,
        mtp_num_layers=1 if mtp else None, mtp_loss_scaling_factor=0.1,
    )
    if moe:
        kwargs.update(num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=64)
    kwargs.update(overrides)
    config = TransformerConfig(**kwargs)
    spec = get_gpt_layer_local_spec(num_experts=kwargs.get("num_moe_experts"), moe_grouped_gemm=False)
    mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False) if mtp else None
    torch.manual_seed(seed)
    model = GPTModel(config, spec, vocab_size=VOCAB, max_sequence_length=SEQ, mtp_block_spec=mtp_spec,
                     share_embeddings_and_output_weights=False,
                     pre_process=_stage()[0], post_process=_stage()[1])
    return model.to(dtype)


def quantized_modules(model) -> Iterator[tuple[str, Any, Any]]:
    """``(name, module, weight_quantizer)`` of every module whose weight quantizer is enabled."""
    for name, module in model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if getattr(quantizer, "is_enabled", False):
            yield name, module, quantizer


def _stage() -> tuple[bool, bool]:
    from megatron.core import parallel_state as mpu

    if not mpu.model_parallel_is_initialized():
        return True, True
    return mpu.is_pipeline_first_stage(), mpu.is_pipeline_last_stage()


def full_state(model) -> dict[str, torch.Tensor]:
    """Parameters of a single-rank model (quantizer state left out), detached copies."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if "_quantizer" not in n}


def load_shard(model, state: dict[str, torch.Tensor]) -> None:
    """Fill a parallel rank's model from a single-rank state: TP slices, global layer and expert numbers."""
    from megatron.core import parallel_state as mpu
    from patchkit.patches.modelopt.qat._export_names import global_names

    names = [n for n, _ in model.named_parameters() if "_quantizer" not in n]
    renamed = global_names(model, names)
    params = dict(model.named_parameters())
    for local, name in renamed.items():
        full = state[name]
        param = params[local]
        if getattr(param, "tensor_model_parallel", False) and param.shape != full.shape:
            expert = ".experts." in name
            size = mpu.get_expert_tensor_parallel_world_size() if expert else mpu.get_tensor_model_parallel_world_size()
            rank = mpu.get_expert_tensor_parallel_rank() if expert else mpu.get_tensor_model_parallel_rank()
            dim = param.partition_dim
            if name.endswith("linear_fc1.weight") and model.config.gated_linear_unit:
                gate, up = full.chunk(2, dim=dim)
                full = torch.cat((gate.chunk(size, dim=dim)[rank], up.chunk(size, dim=dim)[rank]), dim=dim)
            else:
                full = full.chunk(size, dim=dim)[rank]
        with torch.no_grad():
            param.copy_(full)


def qat(model):
    from patchkit.patches.modelopt.qat import apply_qat

    (quantized,) = apply_qat([model], "w4a16_nvfp4")
    return quantized
