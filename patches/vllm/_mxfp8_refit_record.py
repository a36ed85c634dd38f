"""Wraps for vLLM's ModelOpt MXFP8 methods (``ModelOptMxFp8LinearMethod``, ``ModelOptMxFp8FusedMoE``).

The recording is the one every refit patch shares (``_refit_record``). One thing is added, only while
a refit has staged checkpoint parameters on the layer (``LayerRefitState.staging``); a first load,
a dummy start and any other call run upstream's method unchanged:

- ``ModelOptMxFp8FusedMoE.process_weights_after_loading`` returns at once once the layer carries
  ``_already_called_process_weights_after_loading`` (upstream sets it at the first call, vLLM
  0.18-0.33). A refit's re-processing would then leave the staged checkpoint tensors unconverted:
  refused for a dtype mismatch (EMULATION: the kernel weights are bf16 after the first load), or,
  where the backend keeps the checkpoint's shapes and dtypes, copied raw into the kernel tensors.
  The flag is cleared for the refit's own processing (upstream sets it again).

Non-finite values are refused by the refit itself, for every format (``_refit_finite``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._refit_record import wrap_create_weights
from ._refit_record import wrap_process_weights_after_loading as _recording
from ._refit_state import STATE_ATTR

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]

#: upstream's once-only guard on a fused-MoE layer (``ModelOptMxFp8FusedMoE``)
ALREADY_PROCESSED_ATTR = "_already_called_process_weights_after_loading"


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record at the first processing; at a refit's, let upstream's MoE processing
    run again."""
    recording = _recording(original)

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = layer.__dict__.get(STATE_ATTR)
        if state is not None and state.staging is not None:
            layer.__dict__.pop(ALREADY_PROCESSED_ATTR, None)
        return recording(self, layer, *args, **kwargs)

    return process_weights_after_loading
