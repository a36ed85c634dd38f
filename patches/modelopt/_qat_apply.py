"""Apply NVFP4 W4A16 QAT to Megatron model chunks with ``modelopt.torch.quantization.quantize``.

Everything that can be wrong with the request (mode, no quantizable layer, strict ignore patterns)
is checked before ModelOpt converts any module, so a refused request leaves the model as it was.
Weight-only NVFP4 needs no calibration data: ``mtq.quantize`` without a forward loop calibrates the
weight quantizers from the weights themselves.
"""

from __future__ import annotations

import fnmatch
import logging
from typing import Iterable, Sequence

import modelopt.torch.quantization as mtq
from modelopt.torch.quantization.nn import QuantModuleRegistry, TensorQuantizer
from torch import nn

from ._qat_config import build_qat_config, normalize_mode
from ._qat_errors import QATConfigError
from ._qat_names import hf_patterns_to_megatron

logger = logging.getLogger(__name__)

_QUANTIZER_SUFFIXES = (".weight_quantizer", ".input_quantizer", ".output_quantizer")


def _unwrap(chunk: nn.Module) -> nn.Module:
    """The bare model inside Megatron's DDP/FSDP/Float16Module wrappers, so names start at the model root."""
    try:
        from megatron.core.utils import unwrap_model
    except ImportError:
        return chunk
    return unwrap_model(chunk)


def _is_quantizable_linear(module: nn.Module) -> bool:
    """A module ModelOpt can quantize (registered) whose weight is a matrix: a linear, not a norm.

    Embeddings are left out: ModelOpt's default-disabled list switches their quantizers off anyway.
    """
    weight = getattr(module, "weight", None)
    return (
        type(module) in QuantModuleRegistry
        and getattr(weight, "ndim", 0) >= 2
        and not isinstance(module, nn.Embedding)
    )


def quantizable_modules(model: nn.Module) -> list[str]:
    """Names of the linear layers ModelOpt can fake-quantize."""
    return [name for name, module in model.named_modules() if name and _is_quantizable_linear(module)]


def _matches(pattern: str, names: Iterable[str]) -> bool:
    return any(
        fnmatch.fnmatch(name, pattern) or any(fnmatch.fnmatch(name + suffix, pattern) for suffix in _QUANTIZER_SUFFIXES)
        for name in names
    )


def enabled_weight_quantizers(model: nn.Module) -> list[str]:
    """Names of the weight quantizers that are on after quantization."""
    return [
        name for name, module in model.named_modules()
        if name.endswith("weight_quantizer") and isinstance(module, TensorQuantizer) and module.is_enabled
    ]


def apply_qat(
    model_chunks: nn.Module | Sequence[nn.Module],
    mode: str = "w4a16_nvfp4",
    ignore: Iterable[str] = (),
    *,
    quantize_mtp: bool = False,
    backend: str | None = "auto",
    strict_ignore: bool = False,
) -> list[nn.Module]:
    """Fake-quantize the linear weights of every chunk in place for QAT; returns the unwrapped chunks.

    ``ignore`` patterns may use Hugging Face names (``lm_head``, ``*mlp.gate``, ``*self_attn*``); a
    pattern that matches no module of the model is logged as a warning, or raised with
    ``strict_ignore``. Raises :class:`QATConfigError` for an unknown mode or a model without any
    quantizable layer, before touching the model.
    """
    normalize_mode(mode)
    ignore = (ignore,) if isinstance(ignore, str) else tuple(ignore)
    chunks = [model_chunks] if isinstance(model_chunks, nn.Module) else list(model_chunks)
    models = [_unwrap(chunk) for chunk in chunks]
    already = [name for model in models for name, m in model.named_modules() if isinstance(m, TensorQuantizer)]
    if already:
        raise QATConfigError(
            "model already has ModelOpt quantizers; refusing to apply QAT twice",
            ", ".join(type(m).__name__ for m in models), already, "quantizers present",
        )
    all_names = [name for model in models for name, _ in model.named_modules() if name]
    quantizable = [name for model in models for name in quantizable_modules(model)]
    if not quantizable:
        kinds = sorted({type(module).__name__ for model in models for module in model.modules()})
        raise QATConfigError(
            f"no linear layer that ModelOpt can quantize for {mode} QAT in",
            ", ".join(type(m).__name__ for m in models) or "an empty list of chunks",
            kinds, "module types present",
        )
    _check_ignore_patterns(ignore, all_names, quantizable, strict_ignore)

    config = build_qat_config(mode, ignore, quantize_mtp=quantize_mtp, backend=backend)
    for model in models:
        mtq.quantize(model, config, forward_loop=None)
    enabled = [name for model in models for name in enabled_weight_quantizers(model)]
    logger.info("patchkit: %s QAT enabled %d weight quantizers", mode, len(enabled))
    return models


def _check_ignore_patterns(
    ignore: tuple[str, ...], module_names: list[str], quantizable: list[str], strict: bool
) -> None:
    for asked, pattern in hf_patterns_to_megatron(ignore).items():
        if _matches(pattern, module_names):
            logger.debug("patchkit: QAT ignore %r -> %r", asked, pattern)
            continue
        error = QATConfigError(
            "QAT ignore pattern matches no module of the model",
            f"{asked} (as Megatron: {pattern})", quantizable, "quantizable modules",
        )
        if strict:
            raise error
        logger.warning("patchkit: %s", error)

