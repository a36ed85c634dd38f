"""Online FP8 (a bf16 checkpoint vLLM quantises at load) refitted with bf16 weights through patchkit, on real
vLLM.

The layers are vLLM's, built by ``Fp8Config`` without an FP8-serialised checkpoint (0.24, 0.29) or by
``OnlineQuantizationConfig`` with ``fp8_per_tensor`` (0.24+): ``create_weights``, the layerwise online
loading and ``process_weights_after_loading`` are upstream's. On CPU vLLM's compiled quantisation op
(``scaled_fp8_quant``: ``static_scaled_fp8_quant`` on 0.29+, ``dynamic_scaled_fp8_quant`` on 0.24) is the
harness's torch stand-in (``cpu_fp8_ops``, ``cpu_dynamic_fp8_quant``), and the MoE layer gets vLLM's Triton
experts listed for CPU; nothing stands in for the refit. The proof for every case is vLLM's own first load
of the same bf16 weights into a fresh model: after each refit every kernel tensor (the FP8 weights and
their scales) equals that model's bit for bit, and sits at the address it had before.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from fp8_helpers import items
from nvfp4_helpers import assert_same_kernel_state, bits, dummy_started, kernel_state, process_weights_after_loading
from patchkit.patches.vllm.refit import RefitError, refit_weights
from patchkit.patches.vllm.refit._checks._fp8_online import (
    OnlineFp8Linears,
    OnlineFp8Moe,
    config_kinds,
    linear_checkpoint,
    moe_checkpoint,
)
from refit_driver import dropped, first_byte_set, halved, pointers, refit_alternately, retyped
from vllm_fixtures import installed

KINDS = {
    "linear": (OnlineFp8Linears, linear_checkpoint),
    "moe": (OnlineFp8Moe, moe_checkpoint),
}
#: both online-FP8 refit patches: which one records a layer depends on the release and the config
PATCHES = ("vllm.fp8_online_refit", "vllm.fp8_online_moe_refit")
CONFIGS = ("fp8", "online")


@pytest.fixture
def online_fp8(cpu_fp8_ops: None, cpu_dynamic_fp8_quant: None) -> None:
    """vLLM's online-FP8 processing on CPU (the harness's stand-ins), without the refit patches."""


@pytest.fixture
def online_fp8_refit_patches(online_fp8: None) -> object:
    """The online-FP8 refit patches that have a variant for this vLLM, applied for the test."""
    # Both patches' modules imported first, so each patch installs now rather than waiting for them.
    import vllm.model_executor.layers.quantization.fp8  # noqa: F401
    import vllm.model_executor.layers.quantization.online.fp8  # noqa: F401

    import patchkit

    with patchkit.applied(*PATCHES) as records:
        states = {record.id: record.state.value for record in records}
        assert states["vllm.fp8_online_refit"] == "applied", states
        assert states["vllm.fp8_online_moe_refit"] in ("applied", "skipped"), states  # 0.24 only
        yield


def _config(config: str) -> None:
    if config not in config_kinds():
        pytest.skip("this vLLM's Fp8Config quantises no bf16 checkpoint (OnlineQuantizationConfig does)")


def first_load(kind: str, config: str, checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders (which quantise once the layer is loaded), its
    processing."""
    model = KINDS[kind][0](config)
    model.load_weights(items(checkpoint))
    process_weights_after_loading(model)
    return model


def started(kind: str, config: str, start: str, vllm_config: object) -> torch.nn.Module:
    if start == "dummy":
        return dummy_started(KINDS[kind][0](config), vllm_config)
    return first_load(kind, config, KINDS[kind][1](seed=100))


def assert_same_as_first_load(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    ours = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    theirs = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert ours.keys() == theirs.keys()
    assert any(t.dtype == torch.float8_e4m3fn for t in theirs.values())  # vLLM quantised the bf16 weights
    for name, tensor in theirs.items():
        assert (ours[name].shape, ours[name].dtype) == (tensor.shape, tensor.dtype), name
        assert torch.equal(bits(ours[name]), bits(tensor)), name


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_equal_vllms_first_load_in_the_same_kernel_tensors(
    online_fp8_refit_patches: None, vllm_config: object, kind: str, config: str, start: str
) -> None:
    _config(config)
    model = started(kind, config, start, vllm_config)
    refit_alternately(model, [KINDS[kind][1](seed=seed) for seed in (1, 2)], 4,
                      lambda checkpoint: assert_same_as_first_load(model, first_load(kind, config, checkpoint)),
                      pointers)


_wrong_shape = halved(".weight", dim=1)
_fp8_weights = retyped(".weight", torch.float8_e4m3fn)  # pre-quantised weights into a bf16 checkpoint layer
_missing = dropped(lambda name: name.startswith(("down.", "experts.3.down_proj.")))
_nan = first_byte_set(".weight", 0xFF)  # bf16 0x??FF..: the low byte; made NaN below


def _nan_weight(checkpoint: dict[str, torch.Tensor]) -> str:
    name = next(reversed(checkpoint))
    checkpoint[name] = checkpoint[name].clone()
    checkpoint[name].reshape(-1)[0] = float("nan")
    return name


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("spoil", [_wrong_shape, _fp8_weights, _missing, _nan_weight],
                         ids=["wrong-shape", "fp8-weights", "missing-weight", "nan-weight"])
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_bad_tensor_changes_nothing(
    online_fp8_refit_patches: None, vllm_config: object, kind: str, start: str,
    spoil: Callable[[dict[str, torch.Tensor]], str],
) -> None:
    config = config_kinds()[0]
    model = started(kind, config, start, vllm_config)
    before = kernel_state(model)
    bad = KINDS[kind][1](seed=3)
    spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter is not None
    assert_same_kernel_state(model, before)
    # and the next good refit still works
    good = KINDS[kind][1](seed=4)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, first_load(kind, config, good))


@pytest.mark.parametrize("kind", list(KINDS))
def test_without_the_patch_an_online_fp8_layer_is_refused_by_name(
    online_fp8: None, nvfp4_refit_patch: None, vllm_config: object, kind: str
) -> None:
    """Processed before a refit patch recorded it: refused, naming the patch, and nothing changes."""
    config = config_kinds()[0]
    model = first_load(kind, config, KINDS[kind][1](seed=1))
    before = kernel_state(model)
    with pytest.raises(RefitError, match=r"processed before patchkit recorded it.*vllm\.fp8_online_(moe_)?refit"):
        refit_weights(model, items(KINDS[kind][1](seed=2)))
    assert_same_kernel_state(model, before)


def test_vllms_second_load_without_a_refit_keeps_serving_the_first_weights(
    online_fp8: None, vllm_config: object
) -> None:
    """Why the patch exists: vLLM's own second ``load_weights`` plus processing, without patchkit, does
    not serve the new bf16 weights (the layer is marked processed; its loaders write into FP8 tensors)."""
    config = config_kinds()[0]
    model = first_load("linear", config, linear_checkpoint(seed=1))
    second = linear_checkpoint(seed=2)
    try:
        model.load_weights(items(second))
        process_weights_after_loading(model)
    except (RuntimeError, ValueError, AssertionError):
        return  # refused by a loader: not served either
    reference = first_load("linear", config, second)
    assert not all(torch.equal(bits(param), bits(dict(reference.named_parameters())[name]))
                   for name, param in model.named_parameters())


def test_the_patches_install_on_this_release(online_fp8: None) -> None:
    with installed("vllm.fp8_online_refit"):
        pass


# --- power-of-two scales (opt-in ``vllm.fp8_online_pow2_scales``), against NeMo-RL's formula ---


def nemo_rl_pow2_fp8(data_hp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NeMo-RL's FP8 quantisation with ``use_weight_pow2_scale`` (``cast_tensor_to_fp8_blockwise`` in
    ``nemo_rl/models/generation/vllm/quantization/fp8.py`` at 7ea279a), transcribed step by step for one
    block that is the whole tensor: (FP8 data, descale)."""
    max_dtype = torch.finfo(torch.float8_e4m3fn).max
    data_hp = data_hp.to(torch.float32)
    max_abs = torch.amax(torch.abs(data_hp))
    descale = max_abs / max_dtype
    exponent = torch.ceil(torch.log2(descale))
    exponent = torch.clamp(exponent, min=-127, max=127) + 127
    exponent = exponent.to(torch.uint8)
    scale_fp = torch.where(exponent == 0, 1.0, torch.exp2(127 - exponent.to(torch.float32)))
    descale_fp = torch.reciprocal(scale_fp)
    data_lp = torch.clamp(data_hp * scale_fp, min=-1 * max_dtype, max=max_dtype)
    return data_lp.to(torch.float8_e4m3fn), descale_fp


def _skip_without_fp8_scale() -> None:
    from vllm.model_executor.layers.quantization.online import fp8

    if not hasattr(fp8, "_fp8_scale"):
        pytest.skip("vLLM 0.24's online FP8 derives its scales in the compiled op: the option is declared for 0.29+")


@pytest.fixture
def pow2_scales(online_fp8_refit_patches: None) -> object:
    _skip_without_fp8_scale()
    with installed("vllm.fp8_online_pow2_scales"):
        yield


def _served_linear(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each linear layer's FP8 weight in the checkpoint's [out, in] layout, and its scale."""
    return {name: (getattr(model, name).weight.detach().t(), getattr(model, name).weight_scale.detach().reshape(()))
            for name in ("gate_up", "down")}


@pytest.mark.parametrize("start", ["load", "dummy"])
def test_pow2_scales_quantise_as_nemo_rl_does(pow2_scales: None, vllm_config: object, start: str) -> None:
    """With the option, vLLM's first load and every refit quantise bf16 weights exactly as NeMo-RL's pow2
    formula does (one block: the whole tensor), an all-zero weight included (scale 1.0)."""
    model = started("linear", "online", start, vllm_config)
    for seed in (1, 2):
        weights = linear_checkpoint(seed=seed)
        if seed == 2:
            weights["down.weight"] = torch.zeros_like(weights["down.weight"])
        refit_weights(model, items(weights))
        fused = {"gate_up": torch.cat([weights["gate.weight"], weights["up.weight"]]), "down": weights["down.weight"]}
        for name, (served, scale) in _served_linear(model).items():
            data, descale = nemo_rl_pow2_fp8(fused[name])
            assert torch.equal(scale, descale), (name, scale, descale)
            assert torch.equal(bits(served.contiguous()), bits(data)), name
        assert_same_as_first_load(model, first_load("linear", "online", weights))


def test_pow2_scales_round_moe_expert_scales_as_nemo_rl_does(pow2_scales: None, vllm_config: object) -> None:
    model = started("moe", "online", "dummy", vllm_config)
    weights = moe_checkpoint(seed=1)
    refit_weights(model, items(weights))
    routed = model.routed
    for expert in range(routed.w2_weight.shape[0]):
        w13 = torch.cat([weights[f"experts.{expert}.gate_proj.weight"], weights[f"experts.{expert}.up_proj.weight"]])
        w2 = weights[f"experts.{expert}.down_proj.weight"]
        for bf16, scale in ((w13, routed.w13_weight_scale[expert]), (w2, routed.w2_weight_scale[expert])):
            assert torch.equal(scale.detach(), nemo_rl_pow2_fp8(bf16)[1])
    assert_same_as_first_load(model, first_load("moe", "online", weights))


def test_without_the_option_scales_are_vllms_amax_over_448(online_fp8_refit_patches: None) -> None:
    """The option is what makes the scales powers of two: vLLM's own are not (the checkpoint's are not)."""
    _skip_without_fp8_scale()
    weights = linear_checkpoint(seed=1)
    model = first_load("linear", "online", weights)
    scale = model.down.weight_scale.detach().reshape(())
    assert not torch.equal(scale, nemo_rl_pow2_fp8(weights["down.weight"])[1])
    assert torch.equal(scale, weights["down.weight"].float().abs().max() / torch.tensor(448.0))
