"""Build ModelOpt quantize configs for NVFP4 W4A16 QAT, in the shape the installed ModelOpt reads.

Derived from ModelOpt's presets, not copied from them: where ``W4A16_NVFP4_CFG`` exists (0.45+) it is
the base; otherwise the NVFP4 weight-quantizer attributes of ``NVFP4_DEFAULT_CFG`` (E2M1 values,
dynamic blocks of 16, E4M3 block scales) are combined with ``_default_disabled_quantizer_cfg``.
What changes between releases (ModelOpt 0.44 turned ``quant_cfg`` from a dict of
``{pattern: attributes}`` into a list of ``{quantizer_name, enable, cfg}`` entries, and the
default-disabled list with it) is handled here so callers write one config for every release.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Iterable

import modelopt.torch.quantization as mtq
from modelopt.torch.quantization import config as mtq_config
from modelopt.torch.quantization.nn.modules.tensor_quantizer import is_registered_quant_backend

from .._constants import CPU_BACKEND_NAME
from .._errors import QATConfigError
from ._names import hf_patterns_to_megatron, resolve_ignore

logger = logging.getLogger(__name__)

#: Modes :func:`build_qat_config` knows. Activations stay in high precision in all of them.
SUPPORTED_MODES = ("w4a16_nvfp4",)

#: Other names accepted for a mode, as frameworks and ModelOpt spell it. Matched after lower-casing
#: and turning '-' into '_': ``"w4a16"`` is verl's name (there it always means NVFP4 weights, never
#: ModelOpt's INT4 ``W4A16_AWQ``), ``"W4A16_NVFP4_CFG"`` ModelOpt's own preset (0.45+).
MODE_ALIASES: dict[str, str] = {
    "w4a16": "w4a16_nvfp4",
    "nvfp4_w4a16": "w4a16_nvfp4",
    "w4a16_nvfp4_cfg": "w4a16_nvfp4",
}

#: NVFP4 weight fake quantization: E2M1 values, dynamic blocks of 16 along the input dimension,
#: one E4M3 scale per block (and ModelOpt's per-tensor scale from amax on top).
NVFP4_WEIGHT_ATTRIBUTES: dict[str, Any] = {
    "num_bits": (2, 1),
    "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)},
}

#: MTP modules: ModelOpt disables them by default only from 0.46, and only at the model root.
MTP_PATTERNS = ("*mtp.*",)
_MODELOPT_MTP_PATTERN = "mtp.*"


def quant_cfg_is_list() -> bool:
    """Whether the installed ModelOpt reads ``quant_cfg`` as a list of entries (0.44+)."""
    return hasattr(mtq_config, "normalize_quant_cfg_list")


def normalize_mode(mode: str) -> str:
    """The canonical mode name for ``mode`` or one of its :data:`MODE_ALIASES`.

    Raises :class:`QATConfigError` naming the supported modes and their aliases.
    """
    key = mode.strip().lower().replace("-", "_") if isinstance(mode, str) else None
    if key in SUPPORTED_MODES:
        return key
    if key in MODE_ALIASES:
        return MODE_ALIASES[key]
    known = [*SUPPORTED_MODES, *(a.upper() if a.endswith("_cfg") else a for a in MODE_ALIASES)]
    raise QATConfigError("unsupported QAT mode", str(mode), known, "supported")


def resolve_backend(backend: str | None) -> str | None:
    """``"auto"``: patchkit's CPU backend while its patch is applied, else ModelOpt's own kernel."""
    if backend == "auto":
        return CPU_BACKEND_NAME if is_registered_quant_backend(CPU_BACKEND_NAME) else None
    if backend is not None and not is_registered_quant_backend(backend):
        registered = [CPU_BACKEND_NAME] if is_registered_quant_backend(CPU_BACKEND_NAME) else []
        raise QATConfigError(
            "quant backend not registered with ModelOpt (patchkit's CPU one comes with the patch "
            "'modelopt.nvfp4_cpu_fake_quant')",
            backend, registered, "registered by patchkit",
        )
    return backend


def build_qat_config(
    mode: str = "w4a16_nvfp4",
    ignore: Iterable[str] | None = (),
    *,
    quantize_mtp: bool = False,
    backend: str | None = "auto",
    ignore_patterns: Iterable[str] | None = None,
) -> dict[str, Any]:
    """A config for ``mtq.quantize`` that fake-quantizes linear weights to NVFP4, activations untouched.

    ``mode``: ``"w4a16_nvfp4"`` or an alias (:data:`MODE_ALIASES`: ``"w4a16"``, ``"W4A16_NVFP4_CFG"``).
    ``ignore``: fnmatch patterns in Hugging Face or Megatron module names; their quantizers stay off
    (see :func:`hf_patterns_to_megatron`). ModelOpt's default-disabled patterns (output layer,
    routers, ``lm_head``, norms) always apply. MTP modules stay unquantized unless ``quantize_mtp``.
    ``backend``: a registered ModelOpt quant backend for the weight quantizers, ``None`` for
    ModelOpt's kernel, ``"auto"`` (see :func:`resolve_backend`). ``ignore_patterns``: verl's name
    for ``ignore`` (``build_qat_config("w4a16", ignore_patterns=[...])``).
    """
    normalize_mode(mode)
    patterns = resolve_ignore(ignore, ignore_patterns)
    ignored = list(hf_patterns_to_megatron(patterns).values())
    weight = copy.deepcopy(NVFP4_WEIGHT_ATTRIBUTES)
    backend_name = resolve_backend(backend)
    if backend_name is not None:
        weight["backend"] = backend_name
    disabled = ignored if quantize_mtp else [*MTP_PATTERNS, *ignored]
    if quant_cfg_is_list():
        quant_cfg = _list_quant_cfg(weight, disabled, quantize_mtp)
    else:
        quant_cfg = _dict_quant_cfg(weight, disabled, quantize_mtp)
    return {"quant_cfg": quant_cfg, "algorithm": "max"}


def _list_quant_cfg(weight: dict[str, Any], disabled: list[str], quantize_mtp: bool) -> list[dict[str, Any]]:
    """0.44+: entries apply in order, later ones overriding earlier ones for the names they match."""
    preset = getattr(mtq, "W4A16_NVFP4_CFG", None)
    if preset is not None:
        entries = copy.deepcopy(list(preset["quant_cfg"]))
        _set_weight_entry(entries, weight)
    else:
        defaults = copy.deepcopy(list(mtq_config._default_disabled_quantizer_cfg))
        entries = [
            {"quantizer_name": "*", "enable": False},
            {"quantizer_name": "*weight_quantizer", "cfg": weight},
            *defaults,
        ]
    if quantize_mtp:
        entries = [e for e in entries if e.get("quantizer_name") != _MODELOPT_MTP_PATTERN or "parent_class" in e]
    entries.extend({"quantizer_name": pattern, "enable": False} for pattern in disabled)
    return entries


def _set_weight_entry(entries: list[dict[str, Any]], weight: dict[str, Any]) -> None:
    """Put our weight attributes into the preset's weight entry, checking the preset still means NVFP4."""
    for entry in entries:
        if entry.get("quantizer_name") == "*weight_quantizer" and "parent_class" not in entry:
            cfg = entry.get("cfg") or {}
            if (tuple(cfg.get("num_bits", ())), (cfg.get("block_sizes") or {}).get(-1)) != ((2, 1), 16):
                logger.warning(
                    "ModelOpt's W4A16_NVFP4_CFG weight entry is %r, not NVFP4 in blocks of 16; using patchkit's", cfg
                )
            entry["cfg"] = {**cfg, **weight}
            entry.pop("enable", None)
            return
    raise QATConfigError(
        "ModelOpt's W4A16_NVFP4_CFG has no entry", "*weight_quantizer",
        [str(e.get("quantizer_name")) for e in entries], "entries",
    )


def _dict_quant_cfg(weight: dict[str, Any], disabled: list[str], quantize_mtp: bool) -> dict[str, Any]:
    """Before 0.44: ``"default"`` is applied first, then the other keys in insertion order."""
    quant_cfg: dict[str, Any] = {"*weight_quantizer": {**weight, "enable": True}}
    defaults = copy.deepcopy(dict(mtq_config._default_disabled_quantizer_cfg))
    if quantize_mtp:
        defaults.pop(_MODELOPT_MTP_PATTERN, None)
    quant_cfg.update(defaults)
    quant_cfg.setdefault("default", {"enable": False})
    for pattern in disabled:
        quant_cfg.pop(pattern, None)  # re-insert at the end so it overrides what came before
        quant_cfg[pattern] = {"enable": False}
    return quant_cfg
