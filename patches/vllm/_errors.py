"""The public errors of the vLLM patches and the refit API: every one a ``patchkit.PatchkitError``.

A leaf module: it imports nothing from the family, so any module of it can import these without an
import cycle; ``patchkit.patches.vllm.refit`` re-exports them.
"""

from __future__ import annotations

from patchkit.runtime.errors import PatchkitError


class RefitError(PatchkitError, ValueError):
    """A refit could not be applied; the model still serves its previous weights.

    ``layer`` and ``parameter`` name what failed (``None`` when the failure is model-wide);
    ``expected`` and ``got`` describe the parameter and the refit tensor (shape and dtype) when the
    failure is about a tensor.
    """

    def __init__(
        self,
        message: str,
        *,
        layer: str | None = None,
        parameter: str | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        super().__init__(message)
        self.layer = layer
        self.parameter = parameter
        self.expected = expected
        self.got = got


class RefitInProgressError(RefitError):
    """Another refit call is running on this model (another thread), or a refit is already prepared.

    Raised at once, before anything is changed: the refit in progress carries on undisturbed.
    """


class UnsupportedQuantizationError(RefitError):
    """A layer's quantization method is not one patchkit can refit (compressed-tensors, MXFP4 off
    Marlin, AWQ, GPTQ, online FP8...): vLLM's loaders would write checkpoint tensors into its processed kernel
    tensors. Raised before anything is changed.

    ``method`` names the layer's quant method class (and, for compressed-tensors, its scheme);
    ``supported`` says what a refit can take.
    """

    def __init__(self, message: str, *, layer: str, method: str, supported: str) -> None:
        super().__init__(message, layer=layer, expected=supported, got=method)
        self.method = method
        self.supported = supported


class RefitDeviceError(RefitError):
    """A refit tensor holds no data: it is on the ``meta`` device (made under ``torch.device("meta")``,
    or by a lazy exporter that never materialised it). Raised by the parameter's weight loader before
    vLLM's own runs, so nothing is read from it or written; the refit is rolled back like any other.

    Refit tensors on a device that holds data go to vLLM's loaders unchanged; their ``copy_`` moves
    them onto the parameter's device, as when vLLM reads a checkpoint. ``device`` is the refit
    tensor's device.
    """

    def __init__(self, message: str, *, layer: str, parameter: str, expected: str, got: str, device: str) -> None:
        super().__init__(message, layer=layer, parameter=parameter, expected=expected, got=got)
        self.device = device


class LoRATensorsError(PatchkitError, ValueError):
    """A LoRA adapter handed over as tensors was refused before anything was loaded.

    ``tensor`` names the offending tensor as the caller spelled it (``None`` when the PEFT config
    itself is refused); ``expected`` and ``found`` say what the loaded model asks for and what came.
    The worker's adapters are as they were: none was added, evicted or replaced.
    """

    def __init__(
        self,
        message: str,
        *,
        tensor: str | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        super().__init__(message)
        self.tensor = tensor
        self.expected = expected
        self.found = found


class LoRAFromTensorsUnavailableError(PatchkitError, RuntimeError):
    """``vllm.lora_from_tensors`` is not installed in this process (not applied, switched off, or this
    vLLM is outside its ranges): vLLM itself reads adapters only from folders. Raised before anything
    is built."""


class LogitsMaskError(PatchkitError, ValueError):
    """A logits mask was refused: a vocabulary size or banned token id the model's logits cannot take,
    a model without ``compute_logits``, or a second, different mask on a model already masked.

    Raised by ``mask_logits`` before the model is changed, or by the masked ``compute_logits`` when
    the logits it computes are narrower than the mask (a model whose width could not be read ahead).
    """
