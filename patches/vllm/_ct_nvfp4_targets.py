"""The compressed-tensors NVFP4 classes of vLLM 0.24-0.33 (the same names in the three wheels read).

``CompressedTensorsW4A4Fp4`` is the linear scheme for NVFP4 and, with ``use_a16``, NVFP4A16
checkpoints (releases before 0.24 had a separate ``CompressedTensorsW4A16Fp4``, outside the patch's
range and not matched here); ``CompressedTensorsW4A4Nvfp4MoEMethod`` is the fused-MoE method.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.model_executor.layers.quantization.compressed_tensors import schemes
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
    compressed_tensors_moe_w4a4_nvfp4 as moe_nvfp4,
)


@functools.cache
def linear_scheme_classes() -> tuple[type, ...]:
    cls = getattr(schemes, "CompressedTensorsW4A4Fp4", None)
    return (cls,) if cls is not None else ()


@functools.cache
def moe_method_classes() -> tuple[type, ...]:
    cls = getattr(moe_nvfp4, "CompressedTensorsW4A4Nvfp4MoEMethod", None)
    return (cls,) if cls is not None else ()


def is_nvfp4_linear(layer: Any) -> bool:
    """Whether ``layer``'s compressed-tensors scheme (``layer.scheme``) is the NVFP4 one (exactly: a
    subclass may process differently)."""
    return type(getattr(layer, "scheme", None)) in linear_scheme_classes()
