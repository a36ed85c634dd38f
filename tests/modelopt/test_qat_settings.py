"""What apply_qat records for the exporter (MTP option, quantized modules) and the calibration check."""

from __future__ import annotations

import pytest
import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import (
    QATCalibrationError,
    QATSettings,
    apply_qat,
    check_weight_calibration,
    qat_settings,
    weight_amax,
)
from qat_fixtures import mtp_inner  # noqa: E402

QKV_SUFFIX = "self_attention.linear_qkv"
QKV = f"decoder.layers.0.{QKV_SUFFIX}"


def _enabled(model) -> set[str]:
    return {
        name.rsplit(".", 1)[0] for name, m in model.named_modules()
        if name.endswith("weight_quantizer") and isinstance(m, TensorQuantizer) and m.is_enabled
    }


def test_settings_record_the_mode_the_options_and_what_modelopt_quantized(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    assert qat_settings(model) is None
    apply_qat(model, "w4a16", ignore_patterns=["*router*"])
    settings = qat_settings(model)
    assert isinstance(settings, QATSettings)
    assert settings.mode == "w4a16_nvfp4" and settings.quantize_mtp is False
    assert settings.ignore == ("*router*",) and settings.ignore_megatron == ("*router*",)
    assert set(settings.quantized) == _enabled(model) and QKV in settings.quantized
    assert "output_layer" in settings.excluded and f"{mtp_inner(model)}.{QKV_SUFFIX}" in settings.excluded
    assert settings.mtp_quantized == () and settings.input_quantizers_enabled is False
    assert settings.backend == "patchkit_nvfp4_cpu"


def test_mtp_layers_stay_high_precision_by_default_and_quantize_on_request(tiny_moe_gpt, cpu_backend):
    default, asked = tiny_moe_gpt(), tiny_moe_gpt()
    apply_qat(default)
    apply_qat(asked, quantize_mtp=True)
    assert not any(name.startswith("mtp.") for name in _enabled(default))
    mtp = {name for name in _enabled(asked) if name.startswith("mtp.")}
    assert f"{mtp_inner(asked)}.{QKV_SUFFIX}" in mtp and "mtp.layers.0.eh_proj" in mtp
    assert set(qat_settings(asked).mtp_quantized) == mtp and qat_settings(asked).quantize_mtp is True
    # The decoder is quantized the same way either way.
    assert _enabled(default) == _enabled(asked) - mtp


def test_settings_readable_through_wrappers_and_refuse_a_list(tiny_moe_gpt, cpu_backend):
    from megatron.core.transformer.module import Float16Module

    model = tiny_moe_gpt(bf16=True)
    wrapped = Float16Module(model.config, model)
    apply_qat([wrapped])
    assert qat_settings(wrapped) is qat_settings(model) is not None
    with pytest.raises(TypeError, match="one model chunk"):
        qat_settings([wrapped])


def test_calibration_check_passes_after_apply_qat_and_returns_the_quantized_layers(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    assert set(check_weight_calibration(model)) == set(qat_settings(model).quantized)
    layer = model.get_submodule(QKV)
    amax = weight_amax(layer, QKV)
    assert amax.numel() == 1 and float(amax) == float(layer.weight.detach().abs().max())
    # W4A16: input quantizers are disabled and never calibrated.
    assert not layer.input_quantizer.is_enabled and getattr(layer.input_quantizer, "_amax", None) is None


def test_a_weight_quantizer_that_never_saw_data_is_a_typed_error_naming_the_layer(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    layer = model.get_submodule(QKV)
    del layer.weight_quantizer._amax
    with pytest.raises(QATCalibrationError, match=rf"{QKV}: no amax \(the quantizer never saw data\)") as info:
        check_weight_calibration([model])
    assert info.value.layers == {f"chunk 0: {QKV}": "no amax (the quantizer never saw data)"}
    with pytest.raises(QATCalibrationError, match=QKV):
        weight_amax(layer, QKV, check_values=False)


@pytest.mark.parametrize(
    ("amax", "why"),
    [(float("nan"), "non-finite amax"), (-1.0, "negative amax"), (0.0, "amax is 0 but the weight is not all zeros")],
)
def test_unusable_amax_values_are_errors(tiny_moe_gpt, cpu_backend, amax, why):
    model = tiny_moe_gpt()
    apply_qat(model)
    layer = model.get_submodule(QKV)
    layer.weight_quantizer._amax.fill_(amax)
    with pytest.raises(QATCalibrationError, match=why):
        weight_amax(layer, QKV)
    assert weight_amax(layer, QKV, check_values=False) is layer.weight_quantizer._amax


def test_a_zero_weight_with_zero_amax_is_calibrated(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    with torch.no_grad():
        model.get_submodule(QKV).weight.zero_()
    apply_qat(model)
    assert float(weight_amax(model.get_submodule(QKV), QKV)) == 0.0


def test_weight_amax_of_a_layer_without_an_enabled_quantizer_is_a_value_error(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    with pytest.raises(ValueError, match="output_layer has no enabled ModelOpt weight quantizer"):
        weight_amax(model.output_layer, "output_layer")
