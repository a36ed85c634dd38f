"""Wraps for vLLM's ModelOpt MXFP8 methods (``ModelOptMxFp8LinearMethod``, ``ModelOptMxFp8FusedMoE``).

The recording is the one every refit patch shares (``_refit_record``). Two things are added, both only
while a refit has staged checkpoint parameters on the layer (``LayerRefitState.staging``); a first load,
a dummy start and any other call run upstream's method unchanged:

- ``ModelOptMxFp8FusedMoE.process_weights_after_loading`` returns at once once the layer carries
  ``_already_called_process_weights_after_loading`` (upstream sets it at the first call, vLLM
  0.18-0.33). A refit's re-processing would then leave the staged checkpoint tensors unconverted:
  refused for a dtype mismatch (EMULATION: the kernel weights are bf16 after the first load), or,
  where the backend keeps the checkpoint's shapes and dtypes, copied raw into the kernel tensors.
  The flag is cleared for the refit's own processing (upstream sets it again).
- Non-finite checkpoint values are refused before processing, naming the parameter: an E4M3 NaN
  byte (E4M3FN has no infinity) in a weight, or E8M0 ``0xFF`` (NaN) in a scale. Upstream's
  processing takes both without a word and the layer would serve NaN.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ._errors import RefitError
from ._refit_record import wrap_create_weights
from ._refit_record import wrap_process_weights_after_loading as _recording
from ._refit_state import STATE_ATTR, describe_tensor

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]

#: upstream's once-only guard on a fused-MoE layer (``ModelOptMxFp8FusedMoE``)
ALREADY_PROCESSED_ATTR = "_already_called_process_weights_after_loading"
_E8M0_NAN = 0xFF


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record at the first processing; at a refit's, check the staged tensors and
    let upstream's MoE processing run again."""
    recording = _recording(original)

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = layer.__dict__.get(STATE_ATTR)
        if state is not None and state.staging is not None:
            refuse_non_finite(state.staging.params)
            layer.__dict__.pop(ALREADY_PROCESSED_ATTR, None)
        return recording(self, layer, *args, **kwargs)

    return process_weights_after_loading


def refuse_non_finite(params: dict[str, torch.Tensor]) -> None:
    """``RefitError`` naming the first staged MXFP8 parameter that holds a NaN (E4M3 or E8M0)."""
    for name, param in params.items():
        data = param.detach()
        if data.dtype == torch.float8_e4m3fn:
            bad = int(((data.view(torch.uint8) & 0x7F) == 0x7F).sum())
            kind = "E4M3 NaN"
        elif data.dtype == torch.uint8 and "scale" in name:
            bad = int((data == _E8M0_NAN).sum())
            kind = "E8M0 NaN (0xFF)"
        else:
            continue
        if bad:
            raise RefitError(
                f"parameter {name!r} ({describe_tensor(data)}) holds {bad} non-finite value(s) ({kind})",
                parameter=name,
                expected="finite values",
                got=f"{bad} {kind}",
            )
