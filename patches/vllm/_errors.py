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
