"""NVFP4 W4A16 quantization-aware training with ModelOpt: the public helpers.

A public API module: it declares no patch (``patchkit.apply_all()`` does not import it) and imports
nothing heavy. The helpers users call (:func:`build_qat_config`, :func:`apply_qat`,
:func:`qat_settings`, :func:`check_weight_calibration`, :func:`weight_amax`,
:func:`hf_patterns_to_megatron`) live in
``_qat_*`` implementation modules that import ModelOpt and torch at their top; they are reached
through this module's ``__getattr__`` (PEP 562), so ``from patchkit.patches.modelopt.qat import
apply_qat`` works and the cost is paid only by code that uses QAT.

The patch that goes with them, declared in ``nvfp4_cpu_fake_quant``, is opt-in: it registers a
pure-torch NVFP4 fake-quant backend through ModelOpt's ``register_quant_backend``, so QAT runs on machines
without CUDA (CPU CI). While it is applied, :func:`build_qat_config` selects it for the weight
quantizers; on a GPU leave it off and ModelOpt uses its own Triton/CUDA kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._constants import CPU_BACKEND_NAME
from ._errors import ModelOptPluginError, QATApplyError, QATCalibrationError, QATConfigError, QATExportError

if TYPE_CHECKING:
    from ._expert_layout import split_fused_experts
    from ._export_config import export_qat_config
    from ._qat_apply import apply_qat
    from ._qat_calibration import check_weight_calibration, weight_amax
    from ._qat_config import MODE_ALIASES, SUPPORTED_MODES, build_qat_config
    from ._qat_export import export_implementation, export_qat_weights
    from ._qat_names import hf_patterns_to_megatron
    from ._qat_settings import QATSettings, qat_settings

__all__ = [
    "CPU_BACKEND_NAME", "MODE_ALIASES", "ModelOptPluginError", "QATApplyError", "QATCalibrationError",
    "QATConfigError", "QATExportError", "QATSettings", "SUPPORTED_MODES", "apply_qat", "build_qat_config",
    "check_weight_calibration", "export_implementation", "export_qat_config", "export_qat_weights",
    "hf_patterns_to_megatron", "qat_settings", "split_fused_experts", "weight_amax",
]

_LAZY = {
    "apply_qat": "._qat_apply",
    "build_qat_config": "._qat_config",
    "SUPPORTED_MODES": "._qat_config",
    "MODE_ALIASES": "._qat_config",
    "hf_patterns_to_megatron": "._qat_names",
    "QATSettings": "._qat_settings",
    "qat_settings": "._qat_settings",
    "check_weight_calibration": "._qat_calibration",
    "weight_amax": "._qat_calibration",
    # NVFP4 checkpoint export of the QAT model (docs/qat-export.md)
    "export_qat_weights": "._qat_export",
    "export_implementation": "._qat_export",
    "export_qat_config": "._export_config",
    # torch only: a fused-layout stream (or Bridge 0.6's own export) renamed per expert for vLLM's load_weights
    "split_fused_experts": "._expert_layout",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __package__), name)
    globals()[name] = value
    return value

