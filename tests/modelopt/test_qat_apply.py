"""NVFP4 W4A16 QAT on a tiny Megatron GPT (MoE + MTP) with the real ModelOpt, on CPU."""

from __future__ import annotations

import logging

import pytest
import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import QATConfigError, apply_qat
from qat_fixtures import assert_blocks_on_fp4_grid, batch, mtp_inner

LINEARS = ("self_attention.linear_qkv", "self_attention.linear_proj")
EXPERTS = tuple(f"mlp.experts.local_experts.{e}.linear_fc{i}" for e in range(4) for i in (1, 2))


def _quantizers(model, kind: str, enabled: bool) -> set[str]:
    return {
        name.rsplit(".", 1)[0] for name, m in model.named_modules()
        if name.endswith(kind) and isinstance(m, TensorQuantizer) and m.is_enabled == enabled
    }


def _decoder(*suffixes: str) -> set[str]:
    return {f"decoder.layers.{layer}.{suffix}" for layer in range(2) for suffix in suffixes}


def test_qat_enables_exactly_the_decoder_weight_quantizers(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    assert _quantizers(model, "weight_quantizer", True) == _decoder(*LINEARS, *EXPERTS)
    disabled = _quantizers(model, "weight_quantizer", False)
    assert "output_layer" in disabled
    assert any(name.startswith("mtp.") for name in disabled)
    assert not _quantizers(model, "input_quantizer", True) and not _quantizers(model, "output_quantizer", True)
    # Routers are not ModelOpt linears: they get no quantizer at all, so they stay untouched.
    assert not any(".router" in n for n, m in model.named_modules() if isinstance(m, TensorQuantizer))


def test_qat_forward_backward_and_weights_on_the_fp4_grid(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    loss = model(**batch())
    assert loss.shape == (2, 16) and torch.isfinite(loss).all()
    loss.mean().backward()
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    assert qkv.weight.grad is not None and qkv.weight.grad.abs().sum() > 0
    checked = 0
    for name in _decoder(*LINEARS, *EXPERTS):
        module = model.get_submodule(name)
        with torch.no_grad():
            quantized = module.weight_quantizer(module.weight)
        assert not torch.equal(quantized, module.weight), name
        checked += assert_blocks_on_fp4_grid(module.weight, quantized)
    assert checked > 1000


def test_fake_quant_changes_the_forward_output(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt(mtp_num_layers=None)
    model.eval()
    with torch.no_grad():
        before = model(**{k: v for k, v in batch().items() if k != "labels"})
    apply_qat(model)
    with torch.no_grad():
        after = model(**{k: v for k, v in batch().items() if k != "labels"})
    assert before.shape == after.shape and not torch.allclose(before, after)
    assert (before - after).abs().max() < 1.0  # close to the high-precision model, not garbage


def test_hf_ignore_patterns_reach_megatron_modules(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model, ignore=["*self_attn*", "*mlp.gate"])
    assert _quantizers(model, "weight_quantizer", True) == _decoder(*EXPERTS)


def test_quantize_mtp_enables_the_mtp_layer(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model, quantize_mtp=True)
    enabled = _quantizers(model, "weight_quantizer", True)
    mtp = {f"{mtp_inner(model)}.{suffix}" for suffix in (*LINEARS, *EXPERTS)}
    assert mtp <= enabled, sorted(mtp - enabled)
    assert "output_layer" not in enabled


def test_ignore_pattern_matching_nothing_warns_with_what_exists(tiny_moe_gpt, cpu_backend, caplog):
    model = tiny_moe_gpt()
    with caplog.at_level(logging.WARNING, logger="patchkit"):
        apply_qat(model, ignore=["*visual_tower*"])
    (message,) = [r.getMessage() for r in caplog.records if "matches no module" in r.getMessage()]
    assert "*visual_tower*" in message and "decoder.layers.0.self_attention.linear_qkv" in message
    assert _quantizers(model, "weight_quantizer", True)  # still quantized: a warning, not an error


def test_strict_ignore_refuses_and_leaves_the_model_as_it_was(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    classes = {name: type(m) for name, m in model.named_modules()}
    expected = r"matches no module of the model: '\*visual_tower\* .*quantizable modules: .*linear_qkv"
    with pytest.raises(QATConfigError, match=expected):
        apply_qat(model, ignore=["*visual_tower*"], strict_ignore=True)
    assert {name: type(m) for name, m in model.named_modules()} == classes


def test_unsupported_mode_leaves_the_model_as_it_was(tiny_moe_gpt):
    model = tiny_moe_gpt()
    classes = {name: type(m) for name, m in model.named_modules()}
    with pytest.raises(QATConfigError, match="unsupported QAT mode: 'fp8'; supported: w4a16_nvfp4"):
        apply_qat(model, mode="fp8")
    assert {name: type(m) for name, m in model.named_modules()} == classes


def test_model_without_quantizable_linear_is_refused():
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU())
    expected = r"no linear layer .* in: 'Sequential'; module types present: GELU, LayerNorm, Sequential"
    with pytest.raises(QATConfigError, match=expected):
        apply_qat(model)
    assert not any(isinstance(m, TensorQuantizer) for m in model.modules())


def test_quantizing_twice_is_refused(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    with pytest.raises(QATConfigError, match="already has ModelOpt quantizers.*quantizers present: .*weight_quantizer"):
        apply_qat(model)


def test_the_grid_check_rejects_weights_that_are_not_fp4():
    weight = torch.randn(8, 32)
    with pytest.raises(AssertionError, match="distinct magnitudes|off the E2M1 grid"):
        assert_blocks_on_fp4_grid(weight, weight)
    on_grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0] * 2) * 0.37
    assert assert_blocks_on_fp4_grid(on_grid[None], on_grid[None]) == 1
    off_grid = on_grid.clone()
    off_grid[3] = off_grid[11] = 0.37 * 2.5  # 1.5 replaced by 2.5, not an E2M1 value
    with pytest.raises(AssertionError, match="off the E2M1 grid"):
        assert_blocks_on_fp4_grid(off_grid[None], off_grid[None])


@pytest.mark.parametrize(
    "ignore",
    [["*self_attn*"], ["*self_attention*"], ["model.layers.*.self_attn"], ["decoder.layers.*.self_attention"]],
)
def test_hf_and_megatron_ignore_forms_leave_the_same_modules_unquantized(tiny_moe_gpt, cpu_backend, ignore):
    model = tiny_moe_gpt()
    apply_qat(model, ignore=ignore)
    assert _quantizers(model, "weight_quantizer", True) == _decoder(*EXPERTS)


def test_verl_ignore_forms_match_the_model_without_warnings(tiny_moe_gpt, cpu_backend, caplog):
    model = tiny_moe_gpt()
    with caplog.at_level(logging.WARNING, logger="patchkit"):
        apply_qat(model, "w4a16", ignore_patterns=["*output_layer*", "*router*"], strict_ignore=True)
    assert not [r for r in caplog.records if "matches no module" in r.getMessage()]
    assert _quantizers(model, "weight_quantizer", True) == _decoder(*LINEARS, *EXPERTS)


def test_a_single_module_comes_back_as_itself_and_a_list_as_the_same_list(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    assert apply_qat(model) is model
    chunks = [tiny_moe_gpt(seed=1)]
    assert apply_qat(chunks) is chunks


def test_the_same_model_twice_in_the_chunks_is_refused(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    with pytest.raises(QATConfigError, match="the same model appears twice"):
        apply_qat([model, model])
    assert not any(isinstance(m, TensorQuantizer) for m in model.modules())
