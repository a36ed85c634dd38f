"""Which refit backend this process uses, read from the engine's status of ``vllm.nvfp4_refit``."""

from __future__ import annotations

import patchkit

from .refit import PATCH_ID, RefitError


def current_mode() -> str:
    """``"patchkit"`` when the patch is installed; otherwise a RefitError saying why not."""
    (record,) = patchkit.status(PATCH_ID)
    if record.state.installed:
        return "patchkit"
    why = f"{record.state.value}" + (f", {record.reason.value}" if record.reason else "")
    raise RefitError(
        f"refit is unavailable: patch {PATCH_ID!r} is {why}"
        + (f" ({record.detail})" if record.detail else "")
        + "; call patchkit.apply_all() before the model loads (the vLLM plugin does this in every"
        " vLLM process), or see `patchkit list` for the supported vLLM versions"
    )
