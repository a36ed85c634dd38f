"""Why ``vllm.nvfp4_refit`` is not declared ``native`` where vLLM has layerwise reload (0.16+).

These tests run vLLM's own reload (``model_loader/reload``: ``record_metadata_for_reloading``,
``initialize_layerwise_reload``, ``finalize_layerwise_reload``, as ``GPUModelRunner.reload_weights``
does) without patchkit, and pin what it does on this version. Good weights: correct, in the same
kernel tensors. Bad weights: the layer is broken or silently wrong. If an upstream release fixes
the bad-input cases, these tests fail there: the signal to declare that range ``native``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
from nvfp4_helpers import DOWN, TwoLinears, assert_serves, native_reload, natively_loaded, weights_a, weights_b

reload = pytest.importorskip("vllm.model_executor.model_loader.reload")


@contextlib.contextmanager
def _uninitialised_memory_is_nan() -> Iterator[None]:
    import torch.utils.deterministic

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]


def test_native_reload_serves_good_weights_in_the_same_tensors(cpu_nvfp4_kernels: None, vllm_config: object) -> None:
    model = natively_loaded(TwoLinears(), weights_a())
    ptrs = {n: p.data_ptr() for n, p in model.named_parameters()}
    native_reload(model, weights_b(), vllm_config)
    assert_serves(model, weights_b())
    assert {n: p.data_ptr() for n, p in model.named_parameters()} == ptrs


def test_native_reload_with_a_wrong_shape_leaves_the_layer_unusable(
    cpu_nvfp4_kernels: None, vllm_config: object
) -> None:
    model = natively_loaded(TwoLinears(), weights_a())
    bad = weights_b()
    bad[f"{DOWN}.weight"] = bad[f"{DOWN}.weight"][:, :8].contiguous()
    with pytest.raises((AssertionError, RuntimeError)) as caught:
        native_reload(model, bad, vllm_config)
    assert DOWN not in str(caught.value)  # the error names no layer or parameter
    assert all(p.is_meta for p in model.down.parameters())  # the kernel tensors are gone
    with pytest.raises(AttributeError):
        model.down(torch.zeros(1, 32))


def test_native_reload_with_a_missing_parameter_does_not_keep_the_old_weights(
    cpu_nvfp4_kernels: None, vllm_config: object
) -> None:
    """0.29: no error, and the layer serves neither checkpoint (processed from uninitialised
    memory). 0.32: a RuntimeError from the NaN sentinel of the unloaded scale, after which the
    layer no longer serves the previous weights.

    Uninitialised memory is filled with NaN during the reload (torch's deterministic mode): left to
    the allocator, a freed block may still hold the old scale, and whether the layer happens to
    serve the old weights would depend on malloc (seen once in CI on 0.33)."""
    model = natively_loaded(TwoLinears(), weights_a())
    partial = weights_b()
    del partial[f"{DOWN}.weight_scale"]
    with _uninitialised_memory_is_nan():
        try:
            native_reload(model, partial, vllm_config)
        except RuntimeError:
            pass
    for weights in (weights_a(), weights_b()):
        with pytest.raises((AssertionError, AttributeError, RuntimeError, NotImplementedError)):
            assert_serves(model, weights)
