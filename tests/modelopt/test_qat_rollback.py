"""All or nothing across chunks: after any error no chunk keeps ModelOpt quantizers, and a retry works."""

from __future__ import annotations

import pytest
import torch
from modelopt.torch.quantization import model_quant
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import QATApplyError, QATConfigError, apply_qat, qat_settings
from qat_fixtures import batch, fake_quant_weights, wrap_ddp

EXPERT = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1"


def _structure(model) -> dict[str, object]:
    return {
        "classes": {name: type(m) for name, m in model.named_modules()},
        "attributes": {name: sorted(m.__dict__) for name, m in model.named_modules()},
        "hooks": {
            name: len(m._load_state_dict_pre_hooks) + len(m._state_dict_hooks) for name, m in model.named_modules()
        },
    }


def _untouched(model, before) -> None:
    assert not any(isinstance(m, TensorQuantizer) for m in model.modules())
    assert _structure(model) == before
    assert qat_settings(model) is None and not hasattr(model, "_modelopt_state")


def _output(model) -> torch.Tensor:
    with torch.no_grad():
        return model(**batch())  # per-token loss: labels given (MTP models need them on megatron-core < 0.17)


def test_a_nan_weight_in_the_second_chunk_is_refused_before_any_chunk_is_converted(tiny_moe_gpt, cpu_backend):
    first, second = tiny_moe_gpt(seed=0), tiny_moe_gpt(seed=1)
    with torch.no_grad():
        second.get_submodule(EXPERT).weight[0, 0] = float("nan")
    before = [_structure(first), _structure(second)]
    with pytest.raises(QATConfigError, match=rf"non-finite .*'chunk 1: {EXPERT}'"):
        apply_qat([first, second])
    _untouched(first, before[0])
    _untouched(second, before[1])
    with torch.no_grad():
        second.get_submodule(EXPERT).weight[0, 0] = 0.0
    apply_qat([first, second])
    assert qat_settings(first) and qat_settings(second)


def test_a_second_chunk_already_quantized_leaves_the_first_untouched(tiny_moe_gpt, cpu_backend):
    first, second = tiny_moe_gpt(seed=0), tiny_moe_gpt(seed=1)
    apply_qat(second)
    before = _structure(first)
    with pytest.raises(QATConfigError, match="refusing to apply QAT twice"):
        apply_qat([first, second])
    _untouched(first, before)


@pytest.mark.parametrize("where", ["after conversion, before calibration", "after calibration"])
def test_a_failure_inside_modelopts_quantize_on_chunk_2_restores_every_chunk(
    tiny_moe_gpt, cpu_backend, monkeypatch, where
):
    models = [tiny_moe_gpt(seed=0), tiny_moe_gpt(seed=1)]
    chunks = [wrap_ddp(m) for m in models]
    before = [_structure(m) for m in models]
    outputs = [_output(m) for m in models]
    calls = []
    real_calibrate = model_quant.calibrate

    def failing_calibrate(model, *args, **kwargs):
        calls.append(model)
        if len(calls) == 2 and where.startswith("after conversion"):
            raise RuntimeError("injected failure in ModelOpt")
        result = real_calibrate(model, *args, **kwargs)
        if len(calls) == 2:
            raise RuntimeError("injected failure in ModelOpt")
        return result

    monkeypatch.setattr(model_quant, "calibrate", failing_calibrate)
    with pytest.raises(QATApplyError, match=r"chunk 1 of 2 .*RuntimeError: injected failure") as info:
        apply_qat(chunks, "w4a16")
    assert calls == models  # ModelOpt did convert both chunks before the failure
    assert info.value.chunk == 1 and isinstance(info.value.__cause__, RuntimeError)
    for model, structure, output in zip(models, before, outputs, strict=True):
        _untouched(model, structure)
        assert torch.equal(_output(model), output)  # the high-precision model again, bit for bit

    monkeypatch.setattr(model_quant, "calibrate", real_calibrate)
    assert apply_qat(chunks, "w4a16") is chunks
    fresh = tiny_moe_gpt(seed=1)
    apply_qat(fresh)
    got, want = fake_quant_weights(models[1]), fake_quant_weights(fresh)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    chunks[1](**batch()).mean().backward()
    chunks[1].finish_grad_sync()
    assert models[1].get_submodule(EXPERT).weight.main_grad.abs().sum() > 0


def test_parameters_added_under_ddp_are_refused_and_rolled_back(tiny_moe_gpt, cpu_backend, monkeypatch):
    model = tiny_moe_gpt()
    before = _structure(model)
    real_calibrate = model_quant.calibrate

    def calibrate_adding_a_parameter(m, *args, **kwargs):
        m.get_submodule(EXPERT).weight_quantizer.register_parameter("_scale", torch.nn.Parameter(torch.ones(1)))
        return real_calibrate(m, *args, **kwargs)

    monkeypatch.setattr(model_quant, "calibrate", calibrate_adding_a_parameter)
    expected = rf"DistributedDataParallel built no gradient buffer.*new parameters: {EXPERT}.weight_quantizer._scale"
    with pytest.raises(QATApplyError, match=expected):
        apply_qat([wrap_ddp(model)])
    _untouched(model, before)


def test_keyboard_interrupt_is_not_retyped_but_still_rolls_back(tiny_moe_gpt, cpu_backend, monkeypatch):
    model = tiny_moe_gpt()
    before = _structure(model)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(model_quant, "calibrate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        apply_qat(model)
    _untouched(model, before)
