"""The NVFP4 checkpoint helpers the tests and the vLLM self-check share: ``patchkit.patches.vllm._nvfp4_checkpoint``."""

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
    "random_nvfp4", "weights_a", "weights_b",
]
