"""The ModelOpt MXFP8 format's hook for a refit: let its fused-MoE processing run again.

``ModelOptMxFp8FusedMoE.process_weights_after_loading`` returns at once once the layer carries
``_already_called_process_weights_after_loading`` (upstream sets it at the first call, vLLM
0.18-0.33). A refit's re-processing would then leave the staged checkpoint tensors unconverted:
refused for a dtype mismatch (EMULATION: the kernel weights are bf16 after the first load), or,
where the backend keeps the checkpoint's shapes and dtypes, copied raw into the kernel tensors. The
flag is cleared for the refit's own processing only (upstream sets it again); a first load, a dummy
start and any other call run upstream's method unchanged.
"""

from __future__ import annotations

from typing import Any

#: upstream's once-only guard on a fused-MoE layer (``ModelOptMxFp8FusedMoE``)
ALREADY_PROCESSED_ATTR = "_already_called_process_weights_after_loading"


def allow_reprocessing(layer: Any) -> None:
    """Before a refit's processing of ``layer``: clear upstream's once-only guard."""
    layer.__dict__.pop(ALREADY_PROCESSED_ATTR, None)
