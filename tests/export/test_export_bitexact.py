"""The export equals ModelOpt's own NVFP4 export, and dequantizes to the trainer's fake-quantized weight.

Real megatron-core and ModelOpt on CPU (TP=EP=PP=1). The reference is ModelOpt's export functions
(``modelopt.torch.export.quant_utils``: ``get_weight_scaling_factor``, ``get_weight_scaling_factor_2``,
``to_quantized_weight``, what ``export_hf_checkpoint`` calls per linear) applied to the same module.
The trained weight is the module's own ``weight_quantizer(weight)``, what its forward uses.
"""

from __future__ import annotations

import pytest
import torch
from export_models import build_gpt, qat, quantized_modules
from patchkit.patches.modelopt.qat import export_implementation, export_qat_config, export_qat_weights
from patchkit.patches.modelopt.qat._nvfp4_pack import dequantize_nvfp4, quantize_nvfp4

CASES = [
    pytest.param(False, torch.float32, id="dense-fp32"),
    pytest.param(True, torch.float32, id="moe-fp32"),
    pytest.param(True, torch.bfloat16, id="moe-bf16"),
    pytest.param(False, torch.bfloat16, id="dense-bf16"),
]


def _modelopt_reference(module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from modelopt.torch.export import quant_utils

    fmt = quant_utils.get_quantization_format(module)
    assert fmt == quant_utils.QUANTIZATION_W4A16_NVFP4
    scale = quant_utils.get_weight_scaling_factor(module)
    scale_2 = quant_utils.get_weight_scaling_factor_2(module)
    block = quant_utils.get_weight_block_size(module)
    packed = quant_utils.to_quantized_weight(module.weight.detach(), scale, fmt, scale_2, block)
    return packed, scale, scale_2


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8)) \
        if a.dtype == torch.float8_e4m3fn else (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


@pytest.mark.parametrize("moe,dtype", CASES)
def test_export_is_bit_identical_to_modelopt_export_for_every_linear(megatron_cpu, cpu_backend, moe, dtype):
    model = qat(build_gpt(moe, mtp=True, dtype=dtype))
    exported = dict(export_qat_weights([model]))
    assert export_implementation(None) == "megatron"
    modules = dict(model.named_modules())
    quantized = [n for n, m in modules.items() if getattr(getattr(m, "weight_quantizer", None), "is_enabled", False)]
    assert len(quantized) >= (10 if moe else 4)
    for name in quantized:
        packed, scale, scale_2 = _modelopt_reference(modules[name])
        assert exported[f"{name}.weight"].dtype == torch.uint8
        assert _same(exported[f"{name}.weight"], packed), name
        assert _same(exported[f"{name}.weight_scale"], scale), name
        assert _same(exported[f"{name}.weight_scale_2"], scale_2), name
        assert f"{name}.input_scale" not in exported  # W4A16: activations are not quantized
    for name, param in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        if module not in quantized:
            assert _same(exported[name], param.detach()), name
    expected = {n for n, _ in model.named_parameters()} | {
        f"{m}.{s}" for m in quantized for s in ("weight_scale", "weight_scale_2")}
    assert set(exported) == expected


@pytest.mark.parametrize("moe,dtype", CASES)
def test_dequantized_export_equals_the_trainers_fake_quantized_weight(megatron_cpu, cpu_backend, moe, dtype):
    model = qat(build_gpt(moe, dtype=dtype, seed=5))
    exported = dict(export_qat_weights([model]))
    checked = 0
    for name, module, quantizer in quantized_modules(model):
        with torch.no_grad():
            trained = quantizer(module.weight)
        restored = dequantize_nvfp4(exported[f"{name}.weight"], exported[f"{name}.weight_scale"],
                                    exported[f"{name}.weight_scale_2"]).to(trained.dtype)
        assert torch.equal(restored, trained), (name, (restored - trained).abs().max())
        checked += 1
    assert checked >= 4


def test_packing_puts_the_even_element_in_the_low_nibble():
    # 0.5 (code 1) at index 0 and 6.0 (code 7) at index 1 of a block whose amax gives scale 1.
    weight = torch.zeros(1, 16)
    weight[0, 0], weight[0, 1], weight[0, 2] = 0.5, 6.0, -1.0
    packed, scale, scale_2 = quantize_nvfp4(weight, torch.tensor(6.0 * 448.0))
    assert float(scale_2) == 1.0 and float(scale.float()[0, 0]) == 1.0
    assert packed[0, 0].item() == (7 << 4) | 1
    assert packed[0, 1].item() == 0x08 | 2  # -1.0 -> sign bit 3, magnitude index 2, low nibble


def test_quantize_in_slices_equals_one_pass():
    weight = torch.randn(300, 64, dtype=torch.bfloat16)
    amax = weight.float().abs().amax()
    whole = quantize_nvfp4(weight, amax)
    sliced = quantize_nvfp4(weight, amax, slice_bytes=1)
    for a, b in zip(whole[:2], sliced[:2], strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_quant_config_excludes_exactly_the_unquantized_linears(megatron_cpu, cpu_backend):
    model = qat(build_gpt(True, mtp=True))
    config = export_qat_config([model])
    quant = config["hf_quant_config"]["quantization"]
    assert quant["quant_algo"] == "W4A16_NVFP4" and quant["group_size"] == 16
    excluded = quant["exclude_modules"]
    assert "output_layer" in excluded
    assert "decoder.layers.0.mlp.router" in excluded
    assert any(name.startswith("mtp.") for name in excluded)  # apply_qat default: MTP not quantized
    assert not any("self_attention.linear_qkv" in n and not n.startswith("mtp.") for n in excluded)
    assert config["quantization_config"]["quant_method"] == "modelopt"
    assert config["quantization_config"]["exclude_modules"] == excluded
    # the key vLLM reads in config.json's entry (0.24 and 0.29 read no other)
    assert config["quantization_config"]["ignore"] == excluded
