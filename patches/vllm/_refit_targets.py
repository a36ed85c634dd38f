"""Which layers a refit can take, by quant method: an allow-list, checked before anything is written.

- No quant method, vLLM's unquantized linear/embedding/fused-MoE methods (subclasses too, such as the
  MoE router's gate method: they keep the checkpoint layout) and KV-cache methods (their scales are
  refitted by ``_refit_impl``): loaded in place.
- ModelOpt NVFP4 (``vllm.nvfp4_refit``, subclasses too) and FP8 (``vllm.fp8_refit``,
  ``Fp8LinearMethod``/``Fp8MoEMethod`` exactly): refitted once their patch has recorded the layer; a
  layer of one of these that was processed before its patch recorded it is refused by name, naming
  the patch.
- compressed-tensors NVFP4 (``vllm.compressed_tensors_nvfp4_refit``): a ``CompressedTensorsLinearMethod``
  layer whose ``layer.scheme`` is ``CompressedTensorsW4A4Fp4``, and ``CompressedTensorsW4A4Nvfp4MoEMethod``;
  the same rule (recorded, else refused naming the patch).
- ModelOpt MXFP8 (``vllm.mxfp8_refit``, ``ModelOptMxFp8LinearMethod``/``ModelOptMxFp8FusedMoE`` exactly):
  the same rule. From vLLM 0.30 an MXFP8 linear layer uses the generic ``ModelOptLinearMethod``
  (``vllm.nvfp4_refit``).
- MXFP4 fused-MoE (``vllm.mxfp4_moe_refit``, ``GptOssMxfp4MoEMethod``/``Mxfp4MoEMethod`` exactly): the
  same, for a layer on a backend the refit is proven on (``_mxfp4_targets``); any other MXFP4 layer is
  refused, its backend named.
- Anything else (other compressed-tensors schemes, which hang off ``layer.scheme``; AWQ/GPTQ; online
  FP8, a bf16 checkpoint quantised at load, whose classes subclass neither FP8 method): refused.
  Their processing turns checkpoint tensors into kernel tensors patchkit has not recorded, so vLLM's
  loaders would write raw checkpoint values into them and the model would serve garbage.

A fused-MoE layer whose method vLLM wrapped in ``FusedMoEModularMethod`` is judged by the method it
wraps (``old_quant_method``).
"""

from __future__ import annotations

import functools
from typing import Any

from vllm.model_executor.layers.quantization import fp8

from . import _mxfp4_targets
from ._nvfp4_targets import nvfp4_method_classes

_FP8_NAMES = ("Fp8LinearMethod", "Fp8MoEMethod")
#: ``ModelOptMxFp8LinearMethod`` exists in vLLM 0.16-0.29, ``ModelOptMxFp8FusedMoE`` in 0.18-0.33
_MXFP8_NAMES = ("ModelOptMxFp8LinearMethod", "ModelOptMxFp8FusedMoE")

#: What a refit takes, for error messages.
SUPPORTED = (
    "unquantized layers, KV-cache scales, ModelOpt NVFP4 layers (vllm.nvfp4_refit) and FP8-serialised"
    " Fp8LinearMethod/Fp8MoEMethod layers (vllm.fp8_refit), compressed-tensors NVFP4 layers"
    " (vllm.compressed_tensors_nvfp4_refit), ModelOpt MXFP8 layers (vllm.mxfp8_refit), " + _mxfp4_targets.SUPPORTED
)


@functools.cache
def fp8_method_classes() -> tuple[type, ...]:
    return tuple(cls for name in _FP8_NAMES if (cls := getattr(fp8, name, None)) is not None)


@functools.cache
def mxfp8_method_classes() -> tuple[type, ...]:
    from vllm.model_executor.layers.quantization import modelopt

    return tuple(cls for name in _MXFP8_NAMES if (cls := getattr(modelopt, name, None)) is not None)


def recording_patch(method: Any, layer: Any = None) -> str | None:
    """The patch that must record ``layer`` (quant method ``method``) before it can be refitted
    (``None``: a layer the refit loads in place, or does not cover)."""
    method = wrapped_method(method)
    if type(method) in fp8_method_classes():
        return "vllm.fp8_refit"
    if type(method) in mxfp8_method_classes():
        return "vllm.mxfp8_refit"
    if isinstance(method, _nvfp4_classes()):
        return "vllm.nvfp4_refit"
    if _is_compressed_tensors_nvfp4(method, layer):
        return "vllm.compressed_tensors_nvfp4_refit"
    if _mxfp4_targets.is_mxfp4_method(method) and _mxfp4_targets.unrefittable_reason(method) is None:
        return "vllm.mxfp4_moe_refit"
    return None


def _is_compressed_tensors_nvfp4(method: Any, layer: Any) -> bool:
    from ._ct_nvfp4_targets import is_nvfp4_linear, moe_method_classes

    return type(method) in moe_method_classes() or (layer is not None and is_nvfp4_linear(layer))


def loads_in_place(method: Any) -> bool:
    """Whether a layer with quant method ``method`` keeps checkpoint-layout tensors vLLM's loaders can
    write again (or, for KV-cache methods, scales ``_refit_impl`` refits itself)."""
    method = wrapped_method(method)
    return method is None or isinstance(method, _in_place_classes())


def wrapped_method(method: Any) -> Any:
    """The method vLLM's ``FusedMoEModularMethod`` wraps, else ``method`` itself."""
    return getattr(method, "old_quant_method", None) or method


def describe_method(layer: Any, method: Any) -> str:
    """The layer's method class, with the compressed-tensors scheme it delegates to (``layer.scheme``)."""
    method = wrapped_method(method)
    text = type(method).__name__
    scheme = getattr(layer, "scheme", None)
    if scheme is not None:
        text += f" (scheme {type(scheme).__name__})"
    if _mxfp4_targets.is_mxfp4_method(method):
        reason = _mxfp4_targets.unrefittable_reason(method)
        text += f" ({reason or 'MXFP4 backend ' + _mxfp4_targets.backend_name(method)})"
    return text


@functools.cache
def _nvfp4_classes() -> tuple[type, ...]:
    return nvfp4_method_classes()


@functools.cache
def _in_place_classes() -> tuple[type, ...]:
    from vllm.model_executor.layers.fused_moe import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return (UnquantizedLinearMethod, UnquantizedEmbeddingMethod, UnquantizedFusedMoEMethod, BaseKVCacheMethod)
