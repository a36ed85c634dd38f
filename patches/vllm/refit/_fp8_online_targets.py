"""The online-FP8 format's hook for a refit: let upstream's quantisation at load run again.

vLLM's online-FP8 methods (``Fp8PerTensorOnlineLinearMethod``, ``Fp8PerTensorOnlineMoEMethod``) quantise
the bf16 weights in ``process_weights_after_loading`` and then set
``_already_called_process_weights_after_loading`` on the layer, after which the method returns at once
(vLLM's own layerwise reload clears it too). A refit's re-processing would otherwise leave the staged
bf16 weights unquantised and be refused for their dtype. The flag is cleared for the refit's own
processing only (upstream sets it again); a first load, a dummy start and any other call run upstream's
method unchanged.
"""

from __future__ import annotations

from ._mxfp8_targets import allow_reprocessing

__all__ = ["allow_reprocessing"]
