"""The ModelOpt NVFP4 quantize-method classes this vLLM release has (names per drift table 2a/2b)."""

from __future__ import annotations

from vllm.model_executor.layers.quantization import modelopt

# W4A16 exists 0.21-0.29; from 0.30 the generic ModelOptLinearMethod replaces both linear methods.
_NAMES = (
    "ModelOptNvFp4LinearMethod",
    "ModelOptNvFp4W4A16LinearMethod",
    "ModelOptLinearMethod",
    "ModelOptNvFp4FusedMoE",
)


def nvfp4_method_classes() -> tuple[type, ...]:
    return tuple(cls for name in _NAMES if (cls := getattr(modelopt, name, None)) is not None)
