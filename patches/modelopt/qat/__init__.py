"""NVFP4 W4A16 quantization-aware training with ModelOpt: the public helpers.

The QAT family's package is its public API and imports nothing heavy: the helpers users call
(:func:`build_qat_config`, :func:`apply_qat`, :func:`qat_settings`, :func:`check_weight_calibration`,
:func:`weight_amax`, :func:`hf_patterns_to_megatron`, the export functions) live in private modules
that import ModelOpt and torch at their top; they are imported on first use (PEP 562), so ``from
patchkit.patches.modelopt.qat import apply_qat`` works and the cost is paid only by code that uses QAT.

The patch that goes with them, declared beside this file in ``nvfp4_cpu_fake_quant``, is opt-in: it registers a
pure-torch NVFP4 fake-quant backend through ModelOpt's ``register_quant_backend``, so QAT runs on machines
without CUDA (CPU CI). While it is applied, :func:`build_qat_config` selects it for the weight
quantizers; on a GPU leave it off and ModelOpt uses its own Triton/CUDA kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._constants import CPU_BACKEND_NAME
from .._errors import ModelOptPluginError, QATApplyError, QATCalibrationError, QATConfigError, QATExportError

if TYPE_CHECKING:
    from ._apply import apply_qat
    from ._calibration import check_weight_calibration, weight_amax
    from ._config import MODE_ALIASES, SUPPORTED_MODES, build_qat_config
    from ._expert_layout import split_fused_experts
    from ._export import export_implementation, export_qat_weights
    from ._export_config import export_qat_config
    from ._names import hf_patterns_to_megatron
    from ._settings import QATSettings, qat_settings

#: Imported on first use (ModelOpt and torch); the constant and errors above are bound now.
_EXPORTS = {
    "apply_qat": "._apply",
    **dict.fromkeys(("build_qat_config", "SUPPORTED_MODES", "MODE_ALIASES"), "._config"),
    "hf_patterns_to_megatron": "._names",
    **dict.fromkeys(("QATSettings", "qat_settings"), "._settings"),
    **dict.fromkeys(("check_weight_calibration", "weight_amax"), "._calibration"),
    # NVFP4 checkpoint export of the QAT model (docs/qat-export.md)
    **dict.fromkeys(("export_qat_weights", "export_implementation"), "._export"),
    "export_qat_config": "._export_config",
    # torch only: a fused-layout stream (or Bridge 0.6's own export) renamed per expert for vLLM's load_weights
    "split_fused_experts": "._expert_layout",
}
__all__ = [
    "CPU_BACKEND_NAME", "MODE_ALIASES", "ModelOptPluginError", "QATApplyError", "QATCalibrationError",
    "QATConfigError", "QATExportError", "QATSettings", "SUPPORTED_MODES", "apply_qat", "build_qat_config",
    "check_weight_calibration", "export_implementation", "export_qat_config", "export_qat_weights",
    "hf_patterns_to_megatron", "qat_settings", "split_fused_experts", "weight_amax",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
