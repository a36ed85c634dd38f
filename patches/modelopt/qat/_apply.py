"""Apply NVFP4 W4A16 QAT to Megatron model chunks with ``modelopt.torch.quantization.quantize``.

Contract, as a training engine calls it (``self.module = apply_qat(self.module, "w4a16", ...)``):

- Chunks may be wrapped (Megatron ``DistributedDataParallel``, ``Float16Module``, a framework's
  wrapper with ``.module``). Quantizers are inserted into the bare model in place; the return value
  is what the caller passed (the same list, the same wrapper), so wrappers keep working.
- All or nothing: every request check (mode, quantizable layers, ModelOpt's Megatron plugin, ignore
  patterns, a model already quantized, non-finite weights) runs on every chunk before ModelOpt
  converts any; if ModelOpt then fails on some chunk, every chunk is restored
  (:mod:`._rollback`) and :class:`QATApplyError` says which chunk failed and why.
- Weight-only NVFP4 needs no calibration data: ``mtq.quantize`` without a forward loop calibrates
  the weight quantizers' amax from the weights; input quantizers stay disabled (see
  :mod:`._calibration`).
- What was done is recorded on each bare chunk (:func:`qat_settings`) for the weight exporter.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import logging
from typing import Any, Iterable, Sequence, TypeVar

import modelopt.torch.quantization as mtq
import torch
from modelopt.torch.quantization.nn import QuantModuleRegistry, TensorQuantizer
from torch import nn

from .._errors import ModelOptPluginError, QATApplyError, QATConfigError
from ._config import build_qat_config, normalize_mode, resolve_backend
from ._names import hf_patterns_to_megatron, resolve_ignore
from ._plugins import MEGATRON_PLUGIN, megatron_linear_types, megatron_plugin_failure
from ._rollback import ModuleSnapshot
from ._settings import SETTINGS_ATTRIBUTE, QATSettings
from ._wrappers import data_parallel_types, unwrap, wrapper_chain

logger = logging.getLogger(__name__)

_QUANTIZER_SUFFIXES = (".weight_quantizer", ".input_quantizer", ".output_quantizer")

Chunks = TypeVar("Chunks")


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


def _weight_quantizers(model: nn.Module, enabled: bool) -> list[str]:
    """Names of the modules whose weight quantizer is (``enabled``) on or off."""
    return [
        name.rsplit(".", 1)[0] if "." in name else ""
        for name, module in model.named_modules()
        if name.endswith("weight_quantizer") and isinstance(module, TensorQuantizer) and module.is_enabled == enabled
    ]


def enabled_weight_quantizers(model: nn.Module) -> list[str]:
    """Names of the weight quantizers that are on after quantization."""
    return [f"{name}.weight_quantizer" if name else "weight_quantizer" for name in _weight_quantizers(model, True)]


def apply_qat(
    model_chunks: Chunks,
    mode: str = "w4a16_nvfp4",
    ignore: Iterable[str] | str | None = (),
    *,
    quantize_mtp: bool = False,
    backend: str | None = "auto",
    strict_ignore: bool = False,
    ignore_patterns: Iterable[str] | str | None = None,
) -> Chunks:
    """Fake-quantize the linear weights of every chunk in place for QAT; returns ``model_chunks`` itself.

    ``model_chunks``: one model or a list of chunks, each bare or wrapped (Megatron DDP,
    ``Float16Module``, any wrapper with ``.module``); the same objects come back, so
    ``self.module = apply_qat(self.module)`` keeps the wrappers. ``mode``: ``"w4a16_nvfp4"`` or an
    alias (``"w4a16"``, ``"W4A16_NVFP4_CFG"``). ``ignore`` (or verl's ``ignore_patterns``): fnmatch
    patterns in Hugging Face or Megatron names; one that matches no module is logged as a warning,
    or raised with ``strict_ignore``. ``quantize_mtp``: quantize the MTP layers too (default off).

    Raises :class:`QATConfigError` (or its :class:`ModelOptPluginError`) before touching any chunk,
    and :class:`QATApplyError` if ModelOpt fails midway, after restoring every chunk.
    """
    canonical = normalize_mode(mode)
    patterns = resolve_ignore(ignore, ignore_patterns)
    chunks = [model_chunks] if isinstance(model_chunks, nn.Module) else list(model_chunks)  # type: ignore[call-overload]
    models = [unwrap(chunk) for chunk in chunks]
    if len({id(m) for m in models}) != len(models):
        raise QATConfigError("the same model appears twice among the chunks", str(len(models)), [], "chunks")
    _check_request(models, canonical, patterns, strict_ignore)
    backend_name = resolve_backend(backend)
    config = build_qat_config(canonical, patterns, quantize_mtp=quantize_mtp, backend=backend_name)

    snapshots = [ModuleSnapshot(model) for model in models]
    for index, (chunk, model) in enumerate(zip(chunks, models, strict=True)):
        try:
            _quantize_chunk(chunk, model, config)
        except BaseException as exc:
            for snapshot in snapshots:
                snapshot.restore()
            if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: restored, not re-typed
                raise
            raise QATApplyError(index, len(models), f"{type(exc).__name__}: {exc}") from exc

    settings = [
        _record(model, canonical, quantize_mtp, patterns, backend_name) for model in models
    ]
    logger.info(
        "patchkit: %s QAT enabled %d weight quantizers in %d chunk(s) (MTP layers %s)",
        canonical, sum(len(s.quantized) for s in settings), len(models),
        "quantized" if quantize_mtp else "left in high precision",
    )
    return model_chunks


def _check_request(models: Sequence[nn.Module], mode: str, patterns: tuple[str, ...], strict_ignore: bool) -> None:
    """Everything that can be wrong with the request, on every chunk, before any chunk is converted."""
    already = [name for model in models for name, m in model.named_modules() if isinstance(m, TensorQuantizer)]
    if already:
        raise QATConfigError(
            "model already has ModelOpt quantizers; refusing to apply QAT twice",
            ", ".join(type(m).__name__ for m in models), already, "quantizers present",
        )
    module_types = {type(module) for model in models for module in model.modules()}
    plugin_failure = megatron_plugin_failure(module_types)
    if plugin_failure is not None:
        raise ModelOptPluginError(MEGATRON_PLUGIN, plugin_failure, megatron_linear_types(module_types)) from (
            plugin_failure
        )
    quantizable = [name for model in models for name in quantizable_modules(model)]
    if not quantizable:
        raise QATConfigError(
            f"no linear layer that ModelOpt can quantize for {mode} QAT in",
            ", ".join(type(m).__name__ for m in models) or "an empty list of chunks",
            sorted(t.__name__ for t in module_types), "module types present",
        )
    all_names = [name for model in models for name, _ in model.named_modules() if name]
    _check_ignore_patterns(patterns, all_names, quantizable, strict_ignore)
    _check_finite_weights(models)


def _check_finite_weights(models: Sequence[nn.Module]) -> None:
    """Refuse NaN/inf weights in a quantizable linear (ModelOpt would fail on its amax midway).

    One min/max per weight (no full-size temporaries) and one device sync per device, not per layer.
    """
    checks: list[tuple[str, torch.Tensor]] = []
    for index, model in enumerate(models):
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            if not name or not _is_quantizable_linear(module) or not isinstance(weight, torch.Tensor):
                continue
            if weight.is_meta or weight.numel() == 0 or not weight.is_floating_point():
                continue
            try:
                low, high = torch.aminmax(weight.detach())
            except (RuntimeError, NotImplementedError):  # a dtype without min/max (FP8): ModelOpt's to judge
                continue
            label = f"chunk {index}: {name}" if len(models) > 1 else name
            checks.append((label, torch.isfinite(low) & torch.isfinite(high)))
    by_device: dict[torch.device, list[int]] = {}
    for position, (_, ok) in enumerate(checks):
        by_device.setdefault(ok.device, []).append(position)
    bad: list[str] = []
    for positions in by_device.values():
        flags = torch.stack([checks[p][1] for p in positions]).tolist()
        bad += [checks[p][0] for p, ok in zip(positions, flags, strict=True) if not ok]
    if bad:
        raise QATConfigError(
            "non-finite (NaN/inf) weights in layers QAT would quantize; fix the checkpoint or the "
            "update that produced them", ", ".join(bad[:3]), bad, "layers with non-finite weights",
        )


def _quantize_chunk(chunk: nn.Module, model: nn.Module, config: dict[str, Any]) -> None:
    """``mtq.quantize`` one bare model; refuse new parameters under a data-parallel wrapper."""
    before = {id(p) for p in model.parameters()}
    mtq.quantize(model, config, forward_loop=None)
    wrappers = [w for w in wrapper_chain(chunk) if isinstance(w, data_parallel_types())]
    if wrappers:
        added = [name for name, p in model.named_parameters() if id(p) not in before]
        if added:
            raise QATConfigError(
                f"ModelOpt added parameters that {type(wrappers[0]).__name__} built no gradient buffer or "
                "hook for (their gradients would never be reduced); apply QAT before wrapping the model",
                type(wrappers[0]).__name__, added, "new parameters",
            )


def _record(
    model: nn.Module, mode: str, quantize_mtp: bool, patterns: tuple[str, ...], backend: str | None
) -> QATSettings:
    settings = QATSettings(
        mode=mode,
        quantize_mtp=quantize_mtp,
        ignore=patterns,
        ignore_megatron=tuple(hf_patterns_to_megatron(patterns).values()),
        quantized=tuple(_weight_quantizers(model, True)),
        excluded=tuple(_weight_quantizers(model, False)),
        input_quantizers_enabled=any(
            name.endswith("input_quantizer") and isinstance(m, TensorQuantizer) and m.is_enabled
            for name, m in model.named_modules()
        ),
        modelopt_version=importlib.metadata.version("nvidia-modelopt"),
        backend=backend,
    )
    setattr(model, SETTINGS_ATTRIBUTE, settings)
    return settings


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
