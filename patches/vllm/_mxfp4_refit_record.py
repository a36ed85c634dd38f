"""Wraps for vLLM's MXFP4 MoE methods (``GptOssMxfp4MoEMethod``, ``Mxfp4MoEMethod``): record a layer for refit.

The recording is the one ModelOpt NVFP4 and FP8 layers get (``_refit_record``: the checkpoint
parameters ``create_weights`` registered going in, the kernel tensors processing produced coming
out), taken only for a layer a refit can serve exactly (``_mxfp4_targets``: the MARLIN backend),
with the checkpoint's shape of each parameter vLLM padded (``_mxfp4_targets.checkpoint_shapes``).
Any other MXFP4 layer is processed as upstream does and left unrecorded, and a refit refuses it by
name and reason (``_refit_targets``) before writing anything. Nothing of vLLM's methods changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._mxfp4_targets import checkpoint_shapes, unrefittable_reason
from ._refit_record import wrap_create_weights
from ._refit_record import wrap_process_weights_after_loading as _recording
from ._refit_state import CREATED_ATTR

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record the layers a refit can take; process the others untouched."""
    recording = _recording(original, checkpoint_shapes)

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if unrefittable_reason(self) is None:
            return recording(self, layer, *args, **kwargs)
        layer.__dict__.pop(CREATED_ATTR, None)
        return original(self, layer, *args, **kwargs)

    return process_weights_after_loading
