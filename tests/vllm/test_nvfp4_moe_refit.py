"""ModelOpt NVFP4 fused MoE refitted through patchkit, on real vLLM 0.29 (CPU, EMULATION backend).

The layer is built by vLLM's ``FusedMoEFactory`` with ``ModelOptNvFp4Config`` and loaded through
``RoutedExperts.load_weights`` from per-expert ModelOpt checkpoint names. vLLM's NVFP4 MoE forward
needs Triton (GPU), so the checks read what the experts kernel consumes: the processed kernel
tensors, dequantised, against the reference dequantisation of the checkpoint.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from nvfp4_helpers import dequantize, items, process_weights_after_loading, random_nvfp4
from patchkit.patches.vllm.refit import RefitError, refit

EXPERTS, HIDDEN, INTERMEDIATE = 4, 64, 32


def checkpoint(seed: int, weight_scale_2: float, input_scale: float) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for expert in range(EXPERTS):
        for proj, shape in (("gate_proj", (INTERMEDIATE, HIDDEN)), ("up_proj", (INTERMEDIATE, HIDDEN)),
                            ("down_proj", (HIDDEN, INTERMEDIATE))):
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
    def __init__(self) -> None:
        from vllm.model_executor.layers.fused_moe import FusedMoEFactory
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        self.experts = FusedMoEFactory(
            num_experts=EXPERTS, top_k=2, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
            params_dtype=torch.float32, quant_config=ModelOptNvFp4Config("NVFP4", True, None, [], 16),
            prefix=f"model{next(_model_numbers)}.experts", tp_size=1, dp_size=1, pcp_size=1,
        )

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)

    @property
    def routed(self) -> torch.nn.Module:
        return self.experts.routed_experts


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


def test_moe_ten_refits_serve_each_checkpoint_in_the_same_kernel_tensors(nvfp4_refit_patch: None) -> None:
    model = loaded_model(WEIGHTS_A)
    assert_serves(model, WEIGHTS_A)
    before = kernel_view(model)
    method = model.routed.quant_method
    kernel = method.moe_kernel
    for step in range(10):
        weights = WEIGHTS_B if step % 2 == 0 else WEIGHTS_A
        with refit(model):
            model.load_weights(items(weights))
        assert_serves(model, weights)
        assert kernel_view(model) == before
        # The modular kernel built at first load (what a captured graph runs) is kept, and the
        # scales it reads are the layer's refitted tensors.
        assert method.moe_kernel is kernel
        assert kernel.fused_experts.w1_scale_val.data_ptr() == model.routed.w13_weight_scale.data_ptr()


def test_moe_wrong_expert_shape_is_refused_and_previous_weights_kept(nvfp4_refit_patch: None) -> None:
    model = loaded_model(WEIGHTS_A)
    before = kernel_view(model)
    bad = dict(WEIGHTS_B)
    bad["experts.2.down_proj.weight"] = bad["experts.2.down_proj.weight"][:32].contiguous()
    with pytest.raises(RefitError) as caught:
        with refit(model):
            model.load_weights(items(bad))
    # vLLM's MoE loader copies the short tensor into part of the expert without complaint;
    # patchkit's element count catches it.
    assert caught.value.layer == "experts.routed_experts"
    assert caught.value.parameter == "w2_weight"
    assert "(4, 64, 16) torch.uint8" in str(caught.value) and "(32, 16)" in str(caught.value)
    assert_serves(model, WEIGHTS_A)
    assert kernel_view(model) == before


def test_moe_without_patchkit_a_second_load_is_refused_or_wrong(cpu_nvfp4_kernels: None) -> None:
    """Processing reshaped the per-expert scales ([experts, 2] -> [experts]; input scales to scalars)."""
    model = loaded_model(WEIGHTS_A)
    with pytest.raises(Exception) as caught:
        model.load_weights(items(WEIGHTS_B))
        process_weights_after_loading(model)
        assert_serves(model, WEIGHTS_B)
    assert not isinstance(caught.value, RefitError)
