"""W4A16 (Marlin) NVFP4 linear layers refitted after a dummy start, on real vLLM (CPU).

W4A16 is what verl serves (it forces Marlin). The layers are vLLM's, with the ``W4A16_NVFP4``
ModelOpt config: ``ModelOptNvFp4W4A16LinearMethod`` on 0.21-0.29, the generic
``ModelOptLinearMethod`` on 0.30+. Marlin's repack is a CUDA op, so the ``cpu_marlin_layout``
harness stands in for it (a reshape to Marlin's output shape); everything else in processing is
vLLM's. No Marlin forward runs: the checks compare kernel tensors with a normal load's.

vLLM 0.33 keeps ``_nvfp4_*_for_gather`` buffers on layers that ask for them (``_retain_weight_for_gather``,
the Qwen3 DSpark Markov head): copies of the checkpoint weight and scales taken during processing,
because the kernel may rewrite the parameters in place. A refit must refresh those copies too.
"""

from __future__ import annotations

import pytest
import torch
from nvfp4_helpers import (
    assert_same_kernel_state,
    bits,
    dummy_started,
    items,
    kernel_state,
    linear_checkpoint,
    process_weights_after_loading,
)
from patchkit.patches.vllm._nvfp4_checkpoint import Bf16Linears, kernel_name
from patchkit.patches.vllm.refit import RefitError, refit_weights
from vllm_fixtures import installed

GATHER_BUFFERS = ("_nvfp4_weight_for_gather", "_nvfp4_weight_scale_for_gather", "_nvfp4_weight_global_scale_for_gather")


def w4a16_weights(seed: int, *, with_input_scale: bool = False) -> dict[str, torch.Tensor]:
    weights = {
        **linear_checkpoint("up", seed=seed, out_features=64, in_features=128, weight_scale_2=0.01 * (seed + 1),
                            input_scale=1.0),
        **linear_checkpoint("down", seed=seed + 10, out_features=128, in_features=64, weight_scale_2=0.02,
                            input_scale=1.0),
    }
    # A genuine W4A16 export has no input_scale; older exports carried a W4A4-shaped one.
    return weights if with_input_scale else {k: v for k, v in weights.items() if not k.endswith("input_scale")}


def W4A16Linears(retain_for_gather: bool = False) -> Bf16Linears:  # noqa: N802 - reads as the model class
    return Bf16Linears("W4A16_NVFP4", retain_for_gather)


def loaded(weights: dict[str, torch.Tensor], retain_for_gather: bool = False) -> W4A16Linears:
    model = W4A16Linears(retain_for_gather)
    model.load_weights(items(weights))
    process_weights_after_loading(model)
    return model


def assert_same_tensors(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    got = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    want = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(bits(got[name]), bits(tensor)), name


@pytest.mark.parametrize("with_input_scale", [False, True], ids=["w4a16-export", "legacy-input-scale"])
def test_w4a16_dummy_start_refit_equals_a_normal_load(
    nvfp4_refit_patch: None, cpu_marlin_layout: None, vllm_config: object, with_input_scale: bool
) -> None:
    model = dummy_started(W4A16Linears(), vllm_config)
    pointers = {name: t.data_ptr() for name, t in model.named_parameters()}
    for seed in (1, 2, 1):
        weights = w4a16_weights(seed, with_input_scale=with_input_scale)
        refit_weights(model, items(weights))
        assert_same_tensors(model, loaded(weights))
        assert {name: t.data_ptr() for name, t in model.named_parameters()} == pointers


def test_w4a16_missing_weight_scale_is_refused(nvfp4_refit_patch: None, cpu_marlin_layout: None,
                                               vllm_config: object) -> None:
    model = dummy_started(W4A16Linears(), vllm_config)
    before = kernel_state(model)
    weights = {k: v for k, v in w4a16_weights(1).items() if k != "down.weight_scale"}
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(weights))
    assert (caught.value.layer, caught.value.parameter, caught.value.got) == ("down", "weight_scale", "missing")
    assert_same_kernel_state(model, before)


def test_gather_buffers_follow_every_refit(
    nvfp4_refit_patch: None, cpu_marlin_layout: None, vllm_config: object
) -> None:
    from vllm.model_executor.layers.quantization import modelopt

    if not hasattr(modelopt, "ModelOptLinearMethod"):
        pytest.skip("the _nvfp4_*_for_gather buffers exist from vLLM 0.33 (generic ModelOptLinearMethod)")
    model = dummy_started(W4A16Linears(retain_for_gather=True), vllm_config)
    buffers = dict(model.down.named_buffers())
    if not all(name in buffers for name in GATHER_BUFFERS):
        pytest.skip("this vLLM release keeps no _nvfp4_*_for_gather buffers")
    pointers = {name: buffers[name].data_ptr() for name in GATHER_BUFFERS}
    for seed in (1, 2, 3):
        weights = w4a16_weights(seed)
        refit_weights(model, items(weights))
        reference = loaded(weights, retain_for_gather=True)
        for name in GATHER_BUFFERS:
            got, want = getattr(model.down, name), getattr(reference.down, name)
            assert torch.equal(bits(got), bits(want)), f"{name} is stale after refit {seed}"
            assert got.data_ptr() == pointers[name]
        # and they hold this refit's checkpoint, which the gather path dequantises
        assert torch.equal(model.down._nvfp4_weight_for_gather, weights["down.weight"])
        assert torch.equal(model.down._nvfp4_weight_scale_for_gather, weights["down.weight_scale"])


@pytest.mark.parametrize("fault", ["missing-scale", "unknown-name-last", "processing-error"])
def test_gather_buffers_match_the_served_weights_after_a_failed_refit(
    nvfp4_refit_patch: None, cpu_marlin_layout: None, vllm_config: object, fault: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Processing writes the copies; a refit that fails (before or during processing) must leave them
    holding the weights the layer still serves: the previous refit's, at the same addresses."""
    from vllm.model_executor.layers.quantization import modelopt

    if not hasattr(modelopt, "ModelOptLinearMethod"):
        pytest.skip("the _nvfp4_*_for_gather buffers exist from vLLM 0.33 (generic ModelOptLinearMethod)")
    model = dummy_started(W4A16Linears(retain_for_gather=True), vllm_config)
    if not all(name in dict(model.down.named_buffers()) for name in GATHER_BUFFERS):
        pytest.skip("this vLLM release keeps no _nvfp4_*_for_gather buffers")
    first = w4a16_weights(1)
    refit_weights(model, items(first))
    before = kernel_state(model)
    second = w4a16_weights(2)
    if fault == "missing-scale":
        second = {k: v for k, v in second.items() if k != "up.weight_scale"}
    elif fault == "unknown-name-last":
        second["no_such_layer.weight"] = second["down.weight"]
    else:  # down's processing runs in full (writing the copies), then fails
        method = type(model.down.quant_method)
        original = method.process_weights_after_loading

        def failing(self, layer):
            result = original(self, layer)
            if layer is model.down:
                raise RuntimeError("kernel setup failed")
            return result

        monkeypatch.setattr(method, "process_weights_after_loading", failing)
    with pytest.raises(RefitError):
        refit_weights(model, items(second))
    monkeypatch.undo()
    assert_same_kernel_state(model, before)
    assert torch.equal(model.down._nvfp4_weight_for_gather, first["down.weight"])
    assert torch.equal(model.down._nvfp4_weight_scale_for_gather, first["down.weight_scale"])


# --- vllm.nvfp4_marlin_w4a16: an NVFP4 checkpoint served as W4A16 on Marlin, as verl does ---------


def W4A4ConfiguredLinears() -> Bf16Linears:  # noqa: N802 - reads as the model class
    """The same layers, configured as an NVFP4 (W4A4) checkpoint's ``hf_quant_config`` says."""
    return Bf16Linears("NVFP4")


def test_marlin_w4a16_option_is_opt_in(cpu_nvfp4_kernels: None) -> None:
    from patchkit.patches.vllm.nvfp4_marlin_w4a16 import PATCHES

    assert PATCHES[0].opt_in  # off unless PATCHKIT_ENABLE names it
    model = W4A4ConfiguredLinears()
    assert model.quant_algo == "NVFP4"
    assert kernel_name(model.up) == "EmulationNvFp4LinearKernel"  # W4A4: activations quantized


def test_marlin_w4a16_option_serves_an_nvfp4_checkpoint_as_w4a16(
    nvfp4_refit_patch: None, cpu_marlin_layout: None, vllm_config: object
) -> None:
    with installed("vllm.nvfp4_marlin_w4a16"):
        model = dummy_started(W4A4ConfiguredLinears(), vllm_config)
        assert model.quant_algo == "W4A16_NVFP4"
        assert kernel_name(model.up) == kernel_name(model.down) == "MarlinNvFp4LinearKernel"
        # A W4A4-shaped checkpoint (with input scales) refits; its input scales are unread.
        for seed in (1, 2):
            weights = w4a16_weights(seed, with_input_scale=True)
            refit_weights(model, items(weights))
            assert_same_tensors(model, loaded(weights))
        refit_weights(model, items(w4a16_weights(3)))  # and a W4A16 export without them
        assert_same_tensors(model, loaded(w4a16_weights(3)))


def test_marlin_w4a16_option_is_suspended_where_layers_must_follow_the_checkpoint(
    cpu_marlin_layout: None, vllm_config: object
) -> None:
    from patchkit.patches.vllm._nvfp4_marlin_w4a16 import as_checkpoint_says

    import patchkit

    with patchkit.applied("vllm.nvfp4_marlin_w4a16"):
        with as_checkpoint_says():
            kept = W4A4ConfiguredLinears()
        served = W4A4ConfiguredLinears()
    assert (kept.quant_algo, kernel_name(kept.up)) == ("NVFP4", "EmulationNvFp4LinearKernel")
    assert (served.quant_algo, kernel_name(served.up)) == ("W4A16_NVFP4", "MarlinNvFp4LinearKernel")
