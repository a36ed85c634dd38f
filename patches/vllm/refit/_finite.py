"""The refit's one non-finite policy, for every format: NaN or infinity in a weight or scale is refused.

vLLM's loaders and processing take NaN bytes and NaN/Inf scales without a word, and the layer then
serves NaN. A refit refuses them by default, naming the layer and parameter, before anything is
changed. Users who want vLLM's behaviour opt out per call (``allow_non_finite=True`` on
``refit_weights``, ``refit`` and ``prepare_refit``) or per process (``PATCHKIT_REFIT_ALLOW_NON_FINITE``
set to ``1``, read by patchkit's settings like every ``PATCHKIT_*`` variable).

What counts as non-finite, by the staged parameter's dtype:

- floating types (scales, unquantized tensors of a quantized layer): NaN or +-Inf;
- E4M3 (``float8_e4m3fn``: FP8 weights, NVFP4 block scales): the NaN bytes ``0x7F``/``0xFF`` (it has
  no infinity); E5M2: NaN or +-Inf;
- ``uint8`` scales (E8M0, the MX formats' block scales) and ``float8_e8m0fnu`` scales (FP8 block scales
  vLLM keeps as E8M0, ``is_scale_e8m0``): ``0xFF``, E8M0's NaN (``torch.isfinite`` misses it);
- packed integer weights (NVFP4's and MXFP4's E2M1 nibbles, ``uint8``/``int8``/``int32``): none exist.
"""

from __future__ import annotations

import torch

from patchkit.runtime import settings

#: the variable that lets every refit in the process load non-finite values (named in messages)
ALLOW_ENV = settings.REFIT_ALLOW_NON_FINITE
_E8M0_NAN = 0xFF


def allowed(explicit: bool) -> bool:
    """Whether a refit takes non-finite values: asked for by the call, or by the process's settings."""
    return explicit or settings.refit_allows_non_finite()


def non_finite(name: str, tensor: torch.Tensor) -> str | None:
    """What is non-finite in ``tensor`` (the staged parameter ``name``), or ``None`` when all is finite."""
    data = tensor.detach()
    if data.dtype == torch.float8_e4m3fn:
        bad = int(((data.view(torch.uint8) & 0x7F) == 0x7F).sum())
        kind = "E4M3 NaN"
    elif data.dtype == torch.uint8 and "scale" in name:
        bad = int((data == _E8M0_NAN).sum())
        kind = "E8M0 NaN (0xFF)"
    elif data.dtype == torch.float8_e8m0fnu:
        # torch.isfinite calls every E8M0 value finite, its NaN byte included
        bad = int((data.view(torch.uint8) == _E8M0_NAN).sum())
        kind = "E8M0 NaN (0xFF)"
    elif data.is_floating_point():
        wide = data.float() if data.dtype == torch.float8_e5m2 else data
        bad = int((~torch.isfinite(wide)).sum())
        kind = "NaN or infinite"
    else:
        return None
    return f"{bad} {kind} value(s)" if bad else None
