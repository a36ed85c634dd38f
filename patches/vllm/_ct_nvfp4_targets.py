"""The compressed-tensors NVFP4 classes of vLLM 0.24-0.33 (the same names in the three wheels read).

``CompressedTensorsW4A4Fp4`` is the linear scheme for NVFP4 and, with ``use_a16``, NVFP4A16
checkpoints (releases before 0.24 had a separate ``CompressedTensorsW4A16Fp4``, outside the patch's
range and not matched here); ``CompressedTensorsW4A4Nvfp4MoEMethod`` is the fused-MoE method.

The classes are read from the modules already imported, never by importing one: a layer of a class
exists only once its module is imported, and vLLM imports the MoE module only when it builds an
NVFP4 MoE layer. Importing it from a refit's check could land inside vLLM's own import of the
compressed-tensors package, a circular import.
"""

from __future__ import annotations

import sys
from typing import Any

SCHEMES = "vllm.model_executor.layers.quantization.compressed_tensors.schemes"
MOE_NVFP4 = (
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a4_nvfp4"
)


def _imported_class(module: str, name: str) -> type | None:
    cls = getattr(sys.modules.get(module), name, None)
    return cls if isinstance(cls, type) else None


def linear_scheme_classes() -> tuple[type, ...]:
    cls = _imported_class(SCHEMES, "CompressedTensorsW4A4Fp4")
    return (cls,) if cls is not None else ()


def moe_method_classes() -> tuple[type, ...]:
    cls = _imported_class(MOE_NVFP4, "CompressedTensorsW4A4Nvfp4MoEMethod")
    return (cls,) if cls is not None else ()


def is_nvfp4_linear(layer: Any) -> bool:
    """Whether ``layer``'s compressed-tensors scheme (``layer.scheme``) is the NVFP4 one (exactly: a
    subclass may process differently)."""
    return type(getattr(layer, "scheme", None)) in linear_scheme_classes()
