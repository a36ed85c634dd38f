"""The quantised layers a refit must have recorded, by format: a layer of one of these methods that
was processed before its patch recorded it cannot be refitted, and the refit refuses it by name.

ModelOpt NVFP4 (``vllm.nvfp4_refit``) matches subclasses too; FP8 (``vllm.fp8_refit``) matches
``Fp8LinearMethod``/``Fp8MoEMethod`` exactly: their online subclasses (a bf16 checkpoint quantised
at load) run their own methods, which neither patch records or covers.
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.model_executor.layers.quantization import fp8

from ._nvfp4_targets import nvfp4_method_classes

_FP8_NAMES = ("Fp8LinearMethod", "Fp8MoEMethod")


@functools.cache
def fp8_method_classes() -> tuple[type, ...]:
    return tuple(cls for name in _FP8_NAMES if (cls := getattr(fp8, name, None)) is not None)


def recording_patch(method: Any) -> str | None:
    """The patch that must record a layer with quant method ``method`` before it can be refitted
    (``None``: a layer the refit loads in place, or does not cover)."""
    if type(method) in fp8_method_classes():
        return "vllm.fp8_refit"
    if isinstance(method, _nvfp4_classes()):
        return "vllm.nvfp4_refit"
    return None


@functools.cache
def _nvfp4_classes() -> tuple[type, ...]:
    return nvfp4_method_classes()
