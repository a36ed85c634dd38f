"""Which refit backend this process uses, read from the engine's status of the refit patches."""

from __future__ import annotations

import patchkit

from ._constants import REFIT_PATCH_ID as PATCH_ID
from ._errors import RefitError

#: the patches that record layers for ``refit``: NVFP4 (the backend's own id), FP8, compressed-tensors NVFP4,
#: MXFP4 MoE and ModelOpt MXFP8
RECORDING_PATCHES = (PATCH_ID, "vllm.fp8_refit", "vllm.compressed_tensors_nvfp4_refit", "vllm.mxfp4_moe_refit",
                     "vllm.mxfp8_refit")


def current_mode() -> str:
    """``"patchkit"`` when a refit patch is installed; otherwise a RefitError saying why not.

    A layer whose own format's patch is off is refused by name when a refit starts.
    """
    problem = patchkit.why_not_installed(*RECORDING_PATCHES)
    if problem is None:
        return "patchkit"
    raise RefitError(
        f"refit is unavailable: {problem}"
        + "; call patchkit.apply_all() before the model loads (the vLLM plugin does this in every"
        " vLLM process), or see `patchkit list` for the supported vLLM versions"
    )
