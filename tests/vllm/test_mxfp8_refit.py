"""ModelOpt MXFP8 linear and fused-MoE layers refitted through patchkit, on real vLLM.

The layers are vLLM's, with ``ModelOptMxFp8Config``: ``create_weights``, the weight loaders and
``process_weights_after_loading`` are upstream's, on vLLM's emulation kernels (the linear kernel
dequantises to bf16 at load; so does the MoE EMULATION backend). On CPU only the backend selection is
stood in (``patchkit.patches.vllm.refit._checks._mxfp8.emulation_backends``: the emulation linear kernel listed
for the CPU platform; on 0.24 the MoE oracle's EMULATION answer where it finds none). The proof for every
case is vLLM's own first load of the same checkpoint into a fresh model: after each refit every kernel
tensor equals that model's bit for bit, and keeps its object and storage.

Linear layers use ``ModelOptMxFp8LinearMethod`` on vLLM 0.24-0.29 (recorded by ``vllm.mxfp8_refit``) and
the generic ``ModelOptLinearMethod`` from 0.30 (recorded by ``vllm.nvfp4_refit``, applied beside it there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from nvfp4_helpers import (
    assert_same_kernel_state,
    dummy_started,
    kernel_state,
    native_reload,
    natively_loaded,
    process_weights_after_loading,
)
from patchkit.patches.vllm.refit import RefitError, refit_weights
from patchkit.patches.vllm.refit._checks._mxfp8 import (
    MODELS,
    checkpoint,
    emulation_backends,
    first_load,
    has_linear_method,
    items,
)
from patchkit.patches.vllm.refit._checks._round_trip import differing, kernel_bytes
from patchkit.patches.vllm.refit._checks._round_trip import kernel_identities as identities
from refit_driver import dropped, first_byte_set, halved, refit_alternately, retyped
from vllm_fixtures import installed

import patchkit

PATCH = "vllm.mxfp8_refit"
KINDS = ["linear", "moe"]


@pytest.fixture
def emulation(vllm_config: object) -> Iterator[None]:
    with emulation_backends("cpu"):
        yield


def patches_for_linear() -> tuple[str, ...]:
    """What records an MXFP8 linear layer on this vLLM: this patch (0.24-0.29), else ``vllm.nvfp4_refit``."""
    return (PATCH,) if has_linear_method() else (PATCH, "vllm.nvfp4_refit")


@pytest.fixture
def mxfp8_refit_patch(emulation: None) -> Iterator[None]:
    """``vllm.mxfp8_refit`` (and, from vLLM 0.30, ``vllm.nvfp4_refit`` for the linear method) applied."""
    with installed(*patches_for_linear()):
        yield


def started(kind: str, start: str, vllm_config: object) -> torch.nn.Module:
    if start == "dummy":
        return dummy_started(MODELS[kind](), vllm_config)
    return first_load(kind, checkpoint(kind, seed=100))


def assert_same_as_first_load(model: torch.nn.Module, kind: str, weights: dict[str, torch.Tensor]) -> None:
    assert differing(model, kernel_bytes(first_load(kind, weights))) == []


def method_names(model: torch.nn.Module) -> set[str]:
    return {type(m.quant_method).__name__ for m in model.modules() if hasattr(m, "quant_method")}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_equal_vllms_first_load_in_the_same_kernel_tensors(
    mxfp8_refit_patch: None, vllm_config: object, kind: str, start: str
) -> None:
    model = started(kind, start, vllm_config)
    if kind == "moe":
        assert method_names(model) == {"ModelOptMxFp8FusedMoE"}
        assert model.routed.w13_weight.dtype == torch.bfloat16  # EMULATION dequantised it at load
    else:
        assert method_names(model) == {"ModelOptMxFp8LinearMethod" if has_linear_method() else "ModelOptLinearMethod"}
    refit_alternately(model, [checkpoint(kind, seed=seed) for seed in (1, 2)], 4,
                      lambda weights: assert_same_as_first_load(model, kind, weights), identities)


_wrong_shape = halved(".weight", dim=1)
_wrong_dtype = retyped(".weight", torch.bfloat16)
_wrong_scale_dtype = retyped(".weight_scale", torch.float32)
_nan_weight = first_byte_set(".weight", 0x7F)  # E4M3FN NaN
_nan_scale = first_byte_set(".weight_scale", 0xFF)  # E8M0 NaN
_missing_scale = dropped(".weight_scale")


SPOILS = {"wrong-shape": _wrong_shape, "wrong-dtype": _wrong_dtype, "wrong-scale-dtype": _wrong_scale_dtype,
          "nan-weight": _nan_weight, "nan-scale": _nan_scale, "missing-scale": _missing_scale}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("spoil", list(SPOILS.values()), ids=list(SPOILS))
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_a_bad_tensor_raises_a_refit_error_naming_it_and_changes_nothing(
    mxfp8_refit_patch: None, vllm_config: object, kind: str, start: str,
    spoil: Callable[[dict[str, torch.Tensor]], str],
) -> None:
    model = started(kind, start, vllm_config)
    before = kernel_state(model)
    bad = checkpoint(kind, seed=3)
    spoiled = spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    # it names the parameter the spoiled tensor goes to (MoE: the fused w2_*/w13_* one), and its layer
    suffix = spoiled.rsplit(".", 1)[-1]
    fused = ("w2_" if "down_proj" in spoiled else "w13_") + suffix
    assert caught.value.parameter == (fused if kind == "moe" else suffix), (caught.value.parameter, spoiled)
    assert caught.value.layer is not None and caught.value.layer.split(".")[-1] in (
        "routed_experts", "experts", "down", "gate_up"), caught.value.layer
    assert caught.value.parameter in str(caught.value)
    assert_same_kernel_state(model, before)
    good = checkpoint(kind, seed=4)  # and the next good refit still works
    refit_weights(model, items(good))
    assert_same_as_first_load(model, kind, good)


@pytest.mark.parametrize("kind", KINDS)
def test_a_layer_processed_before_the_patch_is_refused_by_name(emulation: None, kind: str) -> None:
    """Without the patch when the model loads, a refit refuses the MXFP8 layer, naming the patch."""
    model = first_load(kind, checkpoint(kind, seed=1))
    before = kernel_state(model)
    recorder = PATCH if kind == "moe" or has_linear_method() else "vllm.nvfp4_refit"
    refused = rf"processed before patchkit recorded it.*{recorder}"
    with patchkit.applied(PATCH), pytest.raises(RefitError, match=refused):
        refit_weights(model, items(checkpoint(kind, seed=2)))
    assert_same_kernel_state(model, before)


# --- what upstream does without the patch -----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_upstreams_second_load_serves_the_wrong_weights(emulation: None, kind: str) -> None:
    """vLLM alone (no patch): a second ``load_weights`` + processing, as an RL loop without patchkit does,
    does not serve the new checkpoint (linear: raw E4M3 values in the bf16 weight, processing skipped;
    MoE: processing runs once per layer)."""
    if kind == "linear" and not has_linear_method():
        pytest.skip("ModelOptMxFp8LinearMethod exists in vLLM 0.16-0.29 only")
    model = first_load(kind, checkpoint(kind, seed=1))
    second = checkpoint(kind, seed=2)
    try:
        model.load_weights(items(second))
        process_weights_after_loading(model)
    except (AttributeError, AssertionError, RuntimeError, ValueError):
        return  # or it cannot load at all
    assert differing(model, kernel_bytes(first_load(kind, second))) != []


def test_upstreams_moe_processing_runs_once_per_layer(emulation: None) -> None:
    """Why the patch lets a refit's processing run again: upstream's MoE method returns at once the second
    time (``_already_called_process_weights_after_loading``), whatever the layer holds."""
    model = first_load("moe", checkpoint("moe", seed=1))
    layer = model.routed
    raw = torch.zeros_like(layer.w13_weight, dtype=torch.float8_e4m3fn)
    layer.w13_weight = torch.nn.Parameter(raw, requires_grad=False)
    layer.quant_method.process_weights_after_loading(layer)
    assert layer.w13_weight.dtype == torch.float8_e4m3fn  # not converted


# --- vLLM's own layerwise reload (reload_weights, vLLM #32133): why MXFP8 is not declared native ---


def _natively_loaded(kind: str) -> torch.nn.Module:
    with torch.device("cpu"):
        model = MODELS[kind]()
    return natively_loaded(model, checkpoint(kind, seed=1))


@pytest.mark.parametrize("kind", KINDS)
def test_native_reload_serves_good_mxfp8_weights_in_the_same_tensors(
    emulation: None, vllm_config: object, kind: str
) -> None:
    """Upstream does the good path: a reload equals a first load, at the same addresses."""
    model = _natively_loaded(kind)
    before = identities(model)
    weights = checkpoint(kind, seed=2)
    native_reload(model, weights, vllm_config)
    assert_same_as_first_load(model, kind, weights)
    assert identities(model) == before


def test_native_reload_with_a_wrong_shape_leaves_the_mxfp8_linear_layer_on_meta(
    emulation: None, vllm_config: object
) -> None:
    model = _natively_loaded("linear")
    bad = checkpoint("linear", seed=2)
    _wrong_shape(bad)
    with pytest.raises(RuntimeError) as caught:
        native_reload(model, bad, vllm_config)
    assert not isinstance(caught.value, RefitError) and "down" not in str(caught.value)  # names nothing
    assert all(p.is_meta for p in model.down.parameters())  # the kernel tensors are gone


def test_native_reload_takes_a_wrong_shape_mxfp8_moe_tensor_without_an_error(
    emulation: None, vllm_config: object
) -> None:
    """A down_proj weight of half the width is reloaded, no error is raised, and the expert's other half is
    whatever the fresh storage held."""
    model = _natively_loaded("moe")
    bad = checkpoint("moe", seed=2)
    _wrong_shape(bad)
    native_reload(model, bad, vllm_config)
    assert not any(p.is_meta for p in model.parameters())


@pytest.mark.parametrize("kind", KINDS)
def test_native_reload_serves_a_nan_mxfp8_weight(emulation: None, vllm_config: object, kind: str) -> None:
    model = _natively_loaded(kind)
    bad = checkpoint(kind, seed=2)
    name = _nan_weight(bad)
    native_reload(model, bad, vllm_config)
    served = model.down.weight if kind == "linear" else model.routed.w2_weight
    assert name.endswith("down.weight") or name.endswith("down_proj.weight")
    assert bool(torch.isnan(served.float()).any())


def test_recording_alone_is_refused_at_the_moe_layers_second_processing(
    mxfp8_refit_patch: None, vllm_config: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the patch clears upstream's once-only flag for a refit: left set, the refit's processing leaves
    the staged E4M3 tensors unconverted (refused here for their dtype; where a backend keeps the checkpoint's
    dtype they would be copied raw)."""
    from patchkit.patches.vllm.refit import _mxfp8_targets

    model = started("moe", "load", vllm_config)
    before = kernel_state(model)
    monkeypatch.setattr(_mxfp8_targets, "ALREADY_PROCESSED_ATTR", "_patchkit_test_no_such_flag")
    with pytest.raises(RefitError, match=r"'w13_weight' is .*bfloat16 but processing produced .*float8_e4m3fn"):
        refit_weights(model, items(checkpoint("moe", seed=1)))
    assert_same_kernel_state(model, before)
