"""The public errors of the ModelOpt patches and QAT helpers (apply, calibrate, export): every one a
``patchkit.PatchkitError``.

A leaf module: it imports nothing from the family (no torch, no ModelOpt), so importing it costs
nothing; ``patchkit.patches.modelopt.qat`` re-exports each.
"""

from __future__ import annotations

from typing import Sequence

from patchkit import PatchkitError


def _shown(items: Sequence[str], limit: int = 12, separator: str = ", ") -> str:
    """The first ``limit`` items, then how many there are in all; "none" for none."""
    shown = separator.join(items[:limit])
    if len(items) > limit:
        shown += f"{separator}... ({len(items)} in all)"
    return shown or "none"


class QATConfigError(PatchkitError, ValueError):
    """A QAT request names something that does not exist: a mode, or modules the model lacks.

    Raised before the model is touched, so the model is left exactly as it was.
    """

    def __init__(self, problem: str, asked: str, available: Sequence[str], label: str = "available") -> None:
        self.asked = asked
        self.available = tuple(available)
        super().__init__(f"{problem}: {asked!r}; {label}: {_shown(self.available)}")


class ModelOptPluginError(QATConfigError):
    """ModelOpt's plugin for the model's framework failed to import, so none of its layers can be quantized.

    ModelOpt imports its plugins inside ``import_plugin`` blocks that swallow the error (ModelOpt
    0.48.0rc1's Megatron plugin imports TransformerEngine unconditionally; without TE it is silently
    skipped and no Megatron linear is registered). ``plugin`` is the plugin module, ``cause`` the
    exception its import raised, ``missing_module`` the module that was not found, if that was why.
    """

    def __init__(self, plugin: str, cause: BaseException, unregistered: Sequence[str]) -> None:
        self.plugin = plugin
        self.cause = cause
        self.asked = plugin
        self.available = tuple(unregistered)
        self.missing_module: str | None = getattr(cause, "name", None) if isinstance(cause, ImportError) else None
        why = f"module {self.missing_module!r} is not installed" if self.missing_module else "its import failed"
        PatchkitError.__init__(
            self,
            f"ModelOpt's Megatron plugin ({plugin}) failed to load: {why} ({type(cause).__name__}: {cause}). "
            f"ModelOpt swallows that error, so it registers none of the model's Megatron layers "
            f"({_shown(self.available)}) and QAT would quantize nothing. Install what the plugin imports "
            "(ModelOpt 0.48's plugin imports TransformerEngine unconditionally) or use a ModelOpt release "
            "whose plugin loads here (0.47 and older import TransformerEngine only if it is installed)",
        )


class QATApplyError(PatchkitError, RuntimeError):
    """ModelOpt failed while quantizing a chunk; every chunk was restored to its state before the call.

    ``chunk`` is the index of the chunk that failed, ``num_chunks`` how many were asked; the original
    exception is ``__cause__``. A second ``apply_qat`` on the same chunks starts from a clean model.
    """

    def __init__(self, chunk: int, num_chunks: int, problem: str) -> None:
        self.chunk = chunk
        self.num_chunks = num_chunks
        super().__init__(
            f"QAT failed on model chunk {chunk} of {num_chunks} (0-based): {problem}; no chunk keeps "
            "ModelOpt quantizers (all were restored), so the call can be retried once the cause is fixed"
        )


class QATCalibrationError(PatchkitError, RuntimeError):
    """An enabled weight quantizer has no usable amax: exporting it would write a zero or NaN scale.

    ``layers`` maps each layer name to what is wrong with its weight quantizer's amax.
    """

    def __init__(self, layers: dict[str, str]) -> None:
        self.layers = dict(layers)
        detail = _shown([f"{name}: {why}" for name, why in self.layers.items()], separator="; ")
        super().__init__(
            f"{len(self.layers)} weight quantizer(s) never calibrated, so their NVFP4 per-tensor scale is "
            f"undefined: {detail}. Quantize with patchkit's apply_qat (it calibrates weight amax from the "
            "weights), or run mtq.calibrate on the model, before exporting"
        )


class QATExportError(PatchkitError, ValueError):
    """A model, quantizer or Bridge that the NVFP4 export cannot turn into a checkpoint.

    Raised before the first tensor is yielded wherever the problem can be seen up front (no QAT,
    an uncalibrated quantizer, a parameter the Bridge does not map), so a consumer such as a vLLM
    refit never receives half a model.
    """

    def __init__(self, problem: str, *, layer: str | None = None, parameter: str | None = None, hint: str = ""):
        self.problem = problem
        self.layer = layer
        self.parameter = parameter
        where = ""
        if layer is not None or parameter is not None:
            where = f" (layer {layer!r}, parameter {parameter!r})"
        super().__init__(f"{problem}{where}" + (f"; {hint}" if hint else ""))
