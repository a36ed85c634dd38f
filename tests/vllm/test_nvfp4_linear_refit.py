"""ModelOpt NVFP4 (W4A4) linear layers refitted through patchkit, on real vLLM (CPU emulation).

Layers are vLLM's ``ColumnParallelLinear``/``RowParallelLinear`` with ``ModelOptNvFp4Config``, so
``create_weights`` and the weight loaders are upstream's; weights go in through vLLM's
``AutoWeightsLoader``; outputs come from vLLM's NVFP4 emulation kernel.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
from nvfp4_helpers import (
    DOWN,
    UP,
    TwoLinears,
    assert_serves,
    items,
    loaded_model,
    process_weights_after_loading,
    weights_a,
    weights_b,
)
from patchkit.patches.vllm.refit import RefitError, abort_refit, finish_refit, prepare_refit, refit


def kernel_view(model: TwoLinears) -> dict[str, tuple[int, int, object]]:
    """Each kernel tensor's object identity, data pointer and weight loader."""
    return {
        f"{layer}.{name}": (id(p), p.data_ptr(), getattr(p, "weight_loader", None))
        for layer in (UP, DOWN)
        for name, p in getattr(model, layer).named_parameters()
    }


def test_first_load_serves_the_reference_dequantised_weights(nvfp4_refit_patch: None) -> None:
    assert_serves(loaded_model(weights_a()), weights_a())


def test_ten_refits_alternating_weights_serve_each_and_keep_kernel_tensors(nvfp4_refit_patch: None) -> None:
    model = loaded_model(weights_a())
    before = kernel_view(model)
    for step in range(10):
        weights = weights_b() if step % 2 == 0 else weights_a()
        with refit(model):
            model.load_weights(items(weights))
        assert_serves(model, weights)
        assert kernel_view(model) == before  # same objects, same storage, same loaders


def test_prepare_restores_checkpoint_parameters_with_their_vllm_classes_and_loaders(
    nvfp4_refit_patch: None,
) -> None:
    from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter

    model = TwoLinears()
    created = {n: (type(p), p.shape, p.dtype, p.__dict__.get("_input_dim"), p.__dict__.get("_output_dim"))
               for n, p in model.up.named_parameters()}
    model.load_weights(items(weights_a()))
    process_weights_after_loading(model)
    assert "weight_scale_2" not in dict(model.up.named_parameters())  # upstream deleted it

    prepare_refit(model)
    staged = dict(model.up.named_parameters())
    assert {n: (type(p), p.shape, p.dtype, p.__dict__.get("_input_dim"), p.__dict__.get("_output_dim"))
            for n, p in staged.items()} == created
    assert type(staged["weight"]) is ModelWeightParameter
    assert type(staged["input_scale"]) is PerTensorScaleParameter
    assert all(callable(p.weight_loader) for p in staged.values())
    abort_refit(model)
    assert_serves(model, weights_a())


def test_hundred_refits_allocate_no_lasting_tensors(nvfp4_refit_patch: None) -> None:
    model = loaded_model(weights_a())
    payloads = (items(weights_b()), items(weights_a()))

    def live_tensors() -> int:
        gc.collect()
        return sum(1 for obj in gc.get_objects() if isinstance(obj, torch.Tensor))

    def one_refit(i: int) -> None:
        with refit(model):
            model.load_weights(payloads[i % 2])

    one_refit(0)
    baseline = live_tensors()
    for i in range(100):
        one_refit(i + 1)
    assert live_tensors() == baseline
    assert_serves(model, weights_b() if 100 % 2 == 0 else weights_a())


# --- bad input: a clear error and the previous weights still served ------------------------------


def bad_refit(corrupt: Callable[[dict[str, torch.Tensor]], None]) -> tuple[TwoLinears, RefitError]:
    model = loaded_model(weights_a())
    before = kernel_view(model)
    weights = weights_b()
    corrupt(weights)
    with pytest.raises(RefitError) as caught:
        with refit(model):
            model.load_weights(items(weights))
    assert_serves(model, weights_a())
    assert kernel_view(model) == before
    # and the model still takes a good refit afterwards
    with refit(model):
        model.load_weights(items(weights_b()))
    assert_serves(model, weights_b())
    return model, caught.value


def test_wrong_shape_names_layer_parameter_and_both_shapes(nvfp4_refit_patch: None) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        weights[f"{DOWN}.weight"] = weights[f"{DOWN}.weight"][:, :8].contiguous()

    _, error = bad_refit(corrupt)
    assert (error.layer, error.parameter) == (DOWN, "weight")
    assert "(64, 16) torch.uint8" in str(error) and "(64, 8) torch.uint8" in str(error)


def test_wrong_dtype_names_layer_parameter_and_both_dtypes(nvfp4_refit_patch: None) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        weights[f"{UP}.weight_scale"] = weights[f"{UP}.weight_scale"].to(torch.float32)

    _, error = bad_refit(corrupt)
    assert (error.layer, error.parameter) == (UP, "weight_scale")
    assert "(32, 4) torch.float8_e4m3fn" in str(error) and "(32, 4) torch.float32" in str(error)


def test_missing_parameter_names_layer_and_parameter(nvfp4_refit_patch: None) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        del weights[f"{DOWN}.weight_scale"]

    _, error = bad_refit(corrupt)
    assert (error.layer, error.parameter) == (DOWN, "weight_scale")
    assert "was not loaded in full: 0 of 128 elements" in str(error)
    assert "(64, 2) torch.float8_e4m3fn" in str(error)


def test_finish_without_prepare_and_double_prepare_are_refused(nvfp4_refit_patch: None) -> None:
    model = loaded_model(weights_a())
    finish_refit(model)  # nothing prepared: nothing to do, nothing changes
    assert_serves(model, weights_a())
    prepare_refit(model)
    with pytest.raises(RefitError, match="already prepared"):
        prepare_refit(model)
    abort_refit(model)
    assert_serves(model, weights_a())


def test_layer_processed_before_the_patch_is_reported_by_name(cpu_nvfp4_kernels: None) -> None:
    import patchkit

    model = loaded_model(weights_a())  # loaded while the patch is not applied
    with patchkit.applied("vllm.nvfp4_refit"):
        with pytest.raises(RefitError, match="'up'.*processed before patchkit recorded it"):
            prepare_refit(model)
    assert_serves(model, weights_a())


# --- without patchkit ----------------------------------------------------------------------------


def test_without_patchkit_a_second_load_fails(cpu_nvfp4_kernels: None) -> None:
    """Upstream deleted the checkpoint scales at first processing: vLLM's loader cannot find them."""
    model = loaded_model(weights_a())
    with pytest.raises(ValueError, match="no module or parameter named 'up.weight_scale_2'"):
        model.load_weights(items(weights_b()))


def test_without_patchkit_the_refit_api_says_why(cpu_nvfp4_kernels: None) -> None:
    model = loaded_model(weights_a())
    with pytest.raises(RefitError, match="vllm.nvfp4_refit"):
        prepare_refit(model)


def test_refit_demands_every_parameter_create_weights_registered(nvfp4_refit_patch: None) -> None:
    """What a refit needs comes from the layer's parameters, not from the first load: a W4A4 layer
    whose first load left ``input_scale`` out (vLLM does not notice) still needs it in a refit,
    because its processing reads it. (W4A16's unread ``input_scale`` placeholder is optional:
    test_dummy_start_refit.py.)"""
    without_input_scale = {k: v for k, v in weights_a().items() if k != f"{UP}.input_scale"}
    model = loaded_model(without_input_scale)
    refit_weights = {k: v for k, v in weights_b().items() if k != f"{UP}.input_scale"}
    with pytest.raises(RefitError) as caught:
        with refit(model):
            model.load_weights(items(refit_weights))
    assert (caught.value.layer, caught.value.parameter) == (UP, "input_scale")
    assert caught.value.got == "missing"
    with refit(model):
        model.load_weights(items(weights_b()))
    assert_serves(model, weights_b())
