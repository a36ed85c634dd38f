"""The typed error of QAT weight export: names the layer and the parameter, says what to do."""

from __future__ import annotations

from patchkit import PatchkitError


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
