"""What ``apply_qat`` did to a model chunk, recorded on the chunk for the weight exporter.

The exporter must write the same format the trainer trained: which linear layers carry NVFP4 weights
and which stay in high precision (MTP layers by default, ignored layers, ModelOpt's default-disabled
output layer and routers), so the ``quantization_config`` a vLLM engine is started with excludes
exactly the layers that were not quantized. ``apply_qat`` stores a :class:`QATSettings` on every bare
chunk it quantized; :func:`qat_settings` reads it through any wrapper.

The quantizers themselves stay the source of truth for *what* is quantized: ``quantized`` and
``excluded`` are read from the model right after ModelOpt converted it (enabled and disabled weight
quantizers), so they are what ModelOpt did, not what patchkit intended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Attribute of the bare chunk holding its :class:`QATSettings` (plain attribute: not in the state dict).
SETTINGS_ATTRIBUTE = "_patchkit_qat_settings"


@dataclass(frozen=True)
class QATSettings:
    """How one model chunk was quantized by :func:`apply_qat`.

    - ``mode``: canonical mode name (``"w4a16_nvfp4"``), whatever alias the caller used.
    - ``quantize_mtp``: whether MTP layers (``mtp.*``) were asked to be quantized.
    - ``ignore``: the ignore patterns as the caller wrote them; ``ignore_megatron``: as ModelOpt saw them.
    - ``quantized``: names (from the bare chunk's root) of the modules whose weight quantizer is enabled.
    - ``excluded``: names of the modules that have a weight quantizer but keep it disabled (ignored,
      MTP unless ``quantize_mtp``, ModelOpt's default-disabled output layer): export them as they are.
    - ``input_quantizers_enabled``: always ``False`` for W4A16 (activations stay in high precision;
      the input quantizers exist but are disabled and never calibrated, so the format has no ``input_scale``).
    - ``modelopt_version``, ``backend``: what did the fake quantization (``None``: ModelOpt's own kernel).
    """

    mode: str
    quantize_mtp: bool
    ignore: tuple[str, ...]
    ignore_megatron: tuple[str, ...]
    quantized: tuple[str, ...]
    excluded: tuple[str, ...]
    input_quantizers_enabled: bool
    modelopt_version: str
    backend: str | None

    @property
    def mtp_quantized(self) -> tuple[str, ...]:
        """The quantized modules that belong to MTP layers (empty unless ``quantize_mtp``)."""
        return tuple(name for name in self.quantized if is_mtp_module(name))


def is_mtp_module(name: str) -> bool:
    """Whether a module name (from the chunk root) is inside Megatron's MTP block (``mtp.layers.N...``)."""
    return name == "mtp" or name.startswith("mtp.") or ".mtp." in name


def qat_settings(model: Any) -> QATSettings | None:
    """The settings ``apply_qat`` recorded on ``model`` (a chunk, wrapped or bare); ``None`` if it did not run.

    For a list of chunks call it per chunk: ``quantized``/``excluded`` name the modules of that chunk.
    """
    from ._wrappers import unwrap

    if isinstance(model, (list, tuple)):
        raise TypeError("qat_settings takes one model chunk; call it for each chunk of the list")
    settings = unwrap(model).__dict__.get(SETTINGS_ATTRIBUTE)
    return settings if isinstance(settings, QATSettings) else None
