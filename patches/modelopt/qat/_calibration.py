"""Calibration state of NVFP4 W4A16 quantizers, checked before export.

NVFP4 W4A16 needs the weight amax only: ModelOpt's per-tensor scale is ``amax / (6 * 448)`` and
the per-block E4M3 scales are computed from the weight on the fly. ``apply_qat`` calls
``mtq.quantize`` without a forward loop, which calibrates every enabled weight quantizer from its
weight (ModelOpt's weight-only "max" pass). Input and output quantizers exist but are disabled and
never calibrated (no ``_amax``): W4A16 keeps activations in high precision and the exported format
has no ``input_scale``.

A weight quantizer can still lack an amax: layers added or re-created after quantization, a ModelOpt
state restored without its buffers, a model quantized by hand with a forward loop that never reached
a layer (an MoE expert no token was routed to). ModelOpt then fake-quantizes with an amax computed on
the fly, so training looks fine, but an exporter reading ``_amax`` would write a zero or garbage
scale. The functions here make that an error naming the layer.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from torch import nn

from .._errors import QATCalibrationError
from ._wrappers import unwrap


def _enabled_weight_quantizer(module: nn.Module) -> TensorQuantizer | None:
    quantizer = getattr(module, "weight_quantizer", None)
    if isinstance(quantizer, TensorQuantizer) and quantizer.is_enabled:
        return quantizer
    return None


def _amax_problem(amax: torch.Tensor | None, weight: torch.Tensor | None) -> str | None:
    """Why ``amax`` cannot give a scale, or ``None`` when it can. Reads values: one device sync."""
    if amax is None:
        return "no amax (the quantizer never saw data)"
    if amax.numel() == 0:
        return "empty amax"
    if not bool(torch.isfinite(amax).all()):
        return f"non-finite amax {amax.flatten()[:4].tolist()}"
    if bool((amax < 0).any()):
        return f"negative amax {amax.flatten()[:4].tolist()}"
    if bool((amax == 0).any()) and weight is not None and bool(weight.detach().ne(0).any()):
        return "amax is 0 but the weight is not all zeros (stale calibration)"
    return None


def weight_amax(module: nn.Module, name: str = "", *, check_values: bool = True) -> torch.Tensor:
    """The calibrated amax of ``module``'s enabled weight quantizer, or :class:`QATCalibrationError`.

    ``name`` is the layer's name for the error message. ``check_values=False`` only checks that an
    amax exists (no device sync); the default also rejects NaN/inf/negative values and a zero amax
    for a non-zero weight. Raises ``ValueError`` if the module has no enabled weight quantizer.
    """
    quantizer = _enabled_weight_quantizer(module)
    if quantizer is None:
        raise ValueError(f"{name or type(module).__name__} has no enabled ModelOpt weight quantizer")
    amax = getattr(quantizer, "_amax", None)
    if amax is None:
        raise QATCalibrationError({name or type(module).__name__: "no amax (the quantizer never saw data)"})
    if check_values:
        problem = _amax_problem(amax, getattr(module, "weight", None))
        if problem is not None:
            raise QATCalibrationError({name or type(module).__name__: problem})
    return amax


def check_weight_calibration(model_chunks: Any) -> list[str]:
    """Check every enabled weight quantizer of the chunks has a usable amax; returns their module names.

    Accepts what :func:`apply_qat` accepts (one chunk or a list, wrapped or bare). Raises
    :class:`QATCalibrationError` listing every layer at fault, not just the first.
    """
    chunks: Iterable[Any] = [model_chunks] if isinstance(model_chunks, nn.Module) else model_chunks
    calibrated: list[str] = []
    problems: dict[str, str] = {}
    for index, chunk in enumerate(chunks):
        prefix = f"chunk {index}: " if not isinstance(model_chunks, nn.Module) else ""
        for name, module in unwrap(chunk).named_modules():
            quantizer = _enabled_weight_quantizer(module)
            if quantizer is None:
                continue
            problem = _amax_problem(getattr(quantizer, "_amax", None), getattr(module, "weight", None))
            if problem is None:
                calibrated.append(name)
            else:
                problems[prefix + name] = problem
    if problems:
        raise QATCalibrationError(problems)
    return calibrated
