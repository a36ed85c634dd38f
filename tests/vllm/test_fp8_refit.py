"""FP8 linear and fused-MoE layers (per-tensor and block-wise) refitted through patchkit, on real vLLM.

The layers are vLLM's, with ``Fp8Config``: ``create_weights``, the weight loaders and
``process_weights_after_loading`` are upstream's (on CPU through the harness's ``cpu_fp8_ops``, which
stands in for two compiled ops and lists the generic block kernel; see ``vllm_cpu_harness``). The
proof for every case is vLLM's own first load of the same checkpoint into a fresh model: after each
refit, every kernel tensor equals that model's bit for bit, and sits at the address it had before.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from fp8_helpers import Fp8Linears, Fp8Moe, items, linear_checkpoint, moe_checkpoint
from nvfp4_helpers import (
    assert_same_as_first_load,
    assert_same_kernel_state,
    bits,
    dummy_started,
    kernel_state,
    native_reload,
    natively_loaded,
    process_weights_after_loading,
)
from patchkit.patches.vllm.refit import RefitError, refit_weights
from refit_driver import dropped, halved, pointers, refit_alternately, retyped

KINDS = {
    "linear": (Fp8Linears, linear_checkpoint),
    "moe": (Fp8Moe, moe_checkpoint),
}
CASES = [pytest.param(kind, block, id=f"{kind}-{'block' if block else 'per-tensor'}")
         for kind in KINDS for block in (False, True)]


def first_load(kind: str, block: bool, checkpoint: dict[str, torch.Tensor]) -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders, its processing."""
    model = KINDS[kind][0](block)
    model.load_weights(items(checkpoint))
    process_weights_after_loading(model)
    return model


def started(kind: str, block: bool, start: str, vllm_config: object) -> torch.nn.Module:
    if start == "dummy":
        return dummy_started(KINDS[kind][0](block), vllm_config)
    return first_load(kind, block, KINDS[kind][1](block, seed=100))


@pytest.mark.parametrize(("kind", "block"), CASES)
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_equal_vllms_first_load_in_the_same_kernel_tensors(
    fp8_refit_patch: None, vllm_config: object, kind: str, block: bool, start: str
) -> None:
    model = started(kind, block, start, vllm_config)
    refit_alternately(model, [KINDS[kind][1](block, seed=seed) for seed in (1, 2)], 4,
                      lambda checkpoint: assert_same_as_first_load(model, first_load(kind, block, checkpoint)),
                      pointers)


_wrong_shape = halved(".weight", dim=1)
_wrong_dtype = retyped(".weight", torch.bfloat16)
_missing_scale = dropped(lambda name: "scale" in name and "input" not in name)


@pytest.mark.parametrize(("kind", "block"), CASES)
@pytest.mark.parametrize("spoil", [_wrong_shape, _wrong_dtype, _missing_scale],
                         ids=["wrong-shape", "wrong-dtype", "missing-scale"])
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_bad_tensor_changes_nothing(
    fp8_refit_patch: None, vllm_config: object, kind: str, block: bool, start: str,
    spoil: Callable[[dict[str, torch.Tensor]], str],
) -> None:
    model = started(kind, block, start, vllm_config)
    before = kernel_state(model)
    bad = KINDS[kind][1](block, seed=3)
    spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter is not None
    assert_same_kernel_state(model, before)
    # and the next good refit still works
    good = KINDS[kind][1](block, seed=4)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, first_load(kind, block, good))


def test_a_layer_processed_before_the_patch_is_refused_by_name(cpu_fp8_ops: None, nvfp4_refit_patch: None) -> None:
    model = first_load("linear", False, linear_checkpoint(False, seed=1))
    before = kernel_state(model)
    with pytest.raises(RefitError, match=r"'gate_up'.*processed before patchkit recorded it.*vllm\.fp8_refit"):
        refit_weights(model, items(linear_checkpoint(False, seed=2)))
    assert_same_kernel_state(model, before)


# --- vLLM's own layerwise reload (reload_weights, vLLM #32133): why FP8 is not declared native ---


def _natively_loaded(kind: str, block: bool) -> torch.nn.Module:
    return natively_loaded(KINDS[kind][0](block), KINDS[kind][1](block, seed=1))


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
def test_native_reload_serves_good_fp8_linear_weights_in_the_same_tensors(
    cpu_fp8_ops: None, vllm_config: object, block: bool
) -> None:
    """Upstream does the good path: a reload equals a first load, at the same addresses."""
    model = _natively_loaded("linear", block)
    ptrs = {name: ptr for name, (ptr, _) in kernel_state(model).items()}
    checkpoint = linear_checkpoint(block, seed=2)
    native_reload(model, checkpoint, vllm_config)
    assert_same_as_first_load(model, first_load("linear", block, checkpoint))
    assert {name: ptr for name, (ptr, _) in kernel_state(model).items()} == ptrs


@pytest.mark.parametrize("block", [False, True], ids=["per-tensor", "block"])
def test_native_reload_with_a_wrong_shape_leaves_the_fp8_linear_layer_on_meta(
    cpu_fp8_ops: None, vllm_config: object, block: bool
) -> None:
    model = _natively_loaded("linear", block)
    bad = linear_checkpoint(block, seed=2)
    _wrong_shape(bad)
    with pytest.raises(RuntimeError) as caught:
        native_reload(model, bad, vllm_config)
    assert "down" not in str(caught.value)  # names no layer or parameter
    assert all(p.is_meta for p in model.down.parameters())  # the kernel tensors are gone


def test_native_reload_takes_a_wrong_shape_fp8_moe_tensor_without_an_error(
    cpu_fp8_ops: None, vllm_config: object
) -> None:
    """Block-wise MoE: a down_proj weight of half the width is reloaded and no error is raised."""
    model = _natively_loaded("moe", True)
    bad = moe_checkpoint(True, seed=2)
    _wrong_shape(bad)
    native_reload(model, bad, vllm_config)
    assert not any(p.is_meta for p in model.parameters())


def test_native_reload_of_good_per_tensor_fp8_moe_weights_serves_a_stale_scale(
    cpu_fp8_ops: None, vllm_config: object
) -> None:
    """Good weights, no error, and the layer does not serve them: the reload counts each expert's input
    scale once per shard, so it processes the layer before the last tensors arrive and drops those as
    "excessive loading". The model's loader looks its parameters up once, before loading, as vLLM's models
    do (``load_by_expert_mapping``); one that looked each up at write time would get the processed
    parameter instead and fail (0.24: ValueError, 0.33: IndexError), which is what this test said before."""
    model = _natively_loaded("moe", False)
    weights = moe_checkpoint(False, seed=2)
    native_reload(model, weights, vllm_config)
    reference = dict(first_load("moe", False, weights).named_parameters())
    stale = sorted(name for name, param in model.named_parameters()
                   if not torch.equal(bits(param), bits(reference[name])))
    assert stale == ["experts.routed_experts.w2_weight_scale"] or stale == ["experts.w2_weight_scale"], stale
