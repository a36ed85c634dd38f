"""NVFP4 helpers for tests/vllm.

The checkpoint helpers are shared with the vLLM self-check and live in
``patchkit.patches.vllm._nvfp4_checkpoint`` (re-exported here); the dummy-start and bit-exact helpers
below are the tests' own.
"""

from __future__ import annotations

import torch
from patchkit.patches.vllm._nvfp4_checkpoint import (  # noqa: F401
    BLOCK,
    DOWN,
    E2M1_VALUES,
    UP,
    TwoLinears,
    assert_serves,
    dequantize,
    exact_activations,
    export_nvfp4,
    items,
    linear_checkpoint,
    linear_reference,
    loaded_model,
    process_weights_after_loading,
    random_nvfp4,
    weights_a,
    weights_b,
)

__all__ = [
    "BLOCK", "DOWN", "E2M1_VALUES", "UP", "TwoLinears", "assert_serves", "dequantize", "exact_activations",
    "export_nvfp4", "items", "linear_checkpoint", "linear_reference", "loaded_model", "process_weights_after_loading",
    "random_nvfp4", "weights_a", "weights_b", "dummy_started", "bits", "kernel_state", "assert_same_kernel_state",
    "natively_loaded", "native_reload",
]


# --- a dummy start and bit-exact comparison ------------------------------------------------------


def dummy_started(model: torch.nn.Module, vllm_config: object) -> torch.nn.Module:
    """What ``LLM(..., load_format="dummy")`` does to the model: vLLM's dummy loader, then processing."""
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    DummyModelLoader(LoadConfig(load_format="dummy")).load_weights(model, vllm_config.model_config)
    process_weights_after_loading(model)
    return model


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor of any dtype and rank, for bit-exact comparison (NaN included)."""
    return tensor.detach().reshape(-1).view(torch.uint8)


def assert_same_as_first_load(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """Every parameter and buffer of ``model`` has the name, shape, dtype and bytes of ``reference``'s
    (vLLM's own first load of the same checkpoint into a fresh model)."""
    ours = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    theirs = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert (ours[name].shape, ours[name].dtype) == (tensor.shape, tensor.dtype), name
        assert torch.equal(bits(ours[name]), bits(tensor)), name


def kernel_state(model: torch.nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    """Every parameter and buffer: data pointer and a copy of its bytes."""
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: (t.data_ptr(), t.detach().clone()) for name, t in tensors.items()}


def assert_same_kernel_state(model: torch.nn.Module, before: dict[str, tuple[int, torch.Tensor]]) -> None:
    after = kernel_state(model)
    assert after.keys() == before.keys()
    for name, (ptr, data) in before.items():
        assert after[name][0] == ptr, name
        assert torch.equal(bits(after[name][1]), bits(data)), name


# --- vLLM's own layer-wise reload (reload_weights, vLLM #32133), for the "why not native" tests --------


def natively_loaded(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    """``model`` prepared for ``reload_weights`` as vLLM's ``initialize_model`` does at build time (its
    metadata recorded), then first-loaded with ``weights`` and processed."""
    from vllm.model_executor.model_loader import reload

    reload.record_metadata_for_reloading(model)
    model.load_weights(items(weights))
    process_weights_after_loading(model)
    return model


def native_reload(model: torch.nn.Module, weights: dict[str, torch.Tensor], vllm_config: object) -> None:
    """vLLM's own layer-wise reload of ``weights`` into ``model``, as ``GPUModelRunner.reload_weights`` runs it."""
    from vllm.model_executor.model_loader import reload

    reload.initialize_layerwise_reload(model)
    model.load_weights(items(weights))
    reload.finalize_layerwise_reload(model, vllm_config.model_config)
