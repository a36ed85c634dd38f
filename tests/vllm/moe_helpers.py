"""A ModelOpt NVFP4 fused-MoE model built from vLLM's own MoE layer, and its checkpoints.

The layer is built by vLLM's MoE factory with ``ModelOptNvFp4Config`` and loaded from per-expert
ModelOpt checkpoint names. vLLM's NVFP4 MoE forward needs Triton (GPU), so checks read what the
experts kernel consumes: the processed kernel tensors, dequantised, against the reference
dequantisation of the checkpoint.
"""

from __future__ import annotations

import itertools

import torch
from nvfp4_helpers import dequantize, items, process_weights_after_loading, random_nvfp4

EXPERTS, HIDDEN, INTERMEDIATE = 4, 64, 32


def checkpoint(seed: int, weight_scale_2: float, input_scale: float, experts: int = EXPERTS, hidden: int = HIDDEN,
               intermediate: int = INTERMEDIATE) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for expert in range(experts):
        for proj, shape in (("gate_proj", (intermediate, hidden)), ("up_proj", (intermediate, hidden)),
                            ("down_proj", (hidden, intermediate))):
            weight, weight_scale = random_nvfp4(generator, *shape)
            name = f"experts.{expert}.{proj}"
            weights[f"{name}.weight"] = weight
            weights[f"{name}.weight_scale"] = weight_scale
            weights[f"{name}.weight_scale_2"] = torch.tensor(weight_scale_2 * (expert + 1))
            weights[f"{name}.input_scale"] = torch.tensor(input_scale)
    return weights


WEIGHTS_A = checkpoint(0, weight_scale_2=0.01, input_scale=1.0)
WEIGHTS_B = checkpoint(1, weight_scale_2=0.02, input_scale=0.5)

# vLLM registers each MoE layer by prefix in the process-wide forward context; names must differ.
_model_numbers = itertools.count()


class MoEModel(torch.nn.Module):
    def __init__(self, experts: int = EXPERTS, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE,
                 params_dtype: torch.dtype = torch.float32, quantized: bool = True) -> None:
        from vllm.model_executor.layers import fused_moe
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        self.num_experts = experts
        # The factory is ``FusedMoE`` (a function) on 0.24 and ``FusedMoEFactory`` later.
        factory = getattr(fused_moe, "FusedMoEFactory", None) or fused_moe.FusedMoE
        self.experts = factory(
            num_experts=experts, top_k=2, hidden_size=hidden, intermediate_size=intermediate,
            params_dtype=params_dtype,
            # quantized=False: vLLM's unquantized MoE, whose parameters a refit writes in place
            quant_config=ModelOptNvFp4Config("NVFP4", True, None, [], 16) if quantized else None,
            prefix=f"model{next(_model_numbers)}.experts", tp_size=1, dp_size=1, pcp_size=1,
        )

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        if hasattr(self.experts, "load_weights"):
            return AutoWeightsLoader(self).load_weights(weights)
        return load_experts_by_mapping(self, weights)

    @property
    def routed(self) -> torch.nn.Module:
        return self.experts.routed_experts


def load_experts_by_mapping(model: torch.nn.Module, weights) -> set[str]:
    """vLLM 0.24: the MoE runner has no ``load_weights``; each model maps per-expert checkpoint
    names to the fused parameters itself (as ``Qwen3MoeModel.load_weights`` does)."""
    from patchkit.patches.vllm._checks._tiny_moe import load_by_expert_mapping

    return load_by_expert_mapping(model, weights, model.num_experts)


def loaded_model(weights: dict[str, torch.Tensor]) -> MoEModel:
    model = MoEModel()
    model.load_weights(items(weights))
    process_weights_after_loading(model)
    return model


def expected_w13(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    def proj(expert: int, name: str) -> torch.Tensor:
        prefix = f"experts.{expert}.{name}"
        return dequantize(weights[f"{prefix}.weight"], weights[f"{prefix}.weight_scale"],
                          weights[f"{prefix}.weight_scale_2"])

    return torch.stack([torch.cat([proj(e, "gate_proj"), proj(e, "up_proj")]) for e in range(EXPERTS)])


def expected_w2(weights: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.stack([
        dequantize(weights[f"experts.{e}.down_proj.weight"], weights[f"experts.{e}.down_proj.weight_scale"],
                   weights[f"experts.{e}.down_proj.weight_scale_2"])
        for e in range(EXPERTS)
    ])


def assert_serves(model: MoEModel, weights: dict[str, torch.Tensor]) -> None:
    layer = model.routed
    w13 = dequantize(layer.w13_weight, layer.w13_weight_scale, layer.w13_weight_scale_2.reshape(-1, 1, 1))
    w2 = dequantize(layer.w2_weight, layer.w2_weight_scale, layer.w2_weight_scale_2.reshape(-1, 1, 1))
    assert torch.equal(w13, expected_w13(weights))
    assert torch.equal(w2, expected_w2(weights))
    # EMULATION quantises activations with 1 / max(input_scale).
    input_scale = weights["experts.0.gate_proj.input_scale"]
    assert torch.equal(layer.w13_input_scale, 1.0 / input_scale)


def kernel_view(model: MoEModel) -> dict[str, tuple[int, int]]:
    return {name: (id(p), p.data_ptr()) for name, p in model.routed.named_parameters()}
