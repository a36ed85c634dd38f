"""Which refit backend this process uses, read from the engine's status of the refit patches."""

from __future__ import annotations

import patchkit

from .._errors import RefitError
from ._formats import recording_patches


def current_mode() -> str:
    """``"patchkit"`` when a refit patch is installed; otherwise a RefitError saying why not.

    A layer whose own format's patch is off is refused by name when a refit starts.
    """
    # the patches that record layers for a refit, one per format (``_formats.FORMATS``)
    problem = patchkit.why_not_installed(*recording_patches())
    if problem is None:
        return "patchkit"
    raise RefitError(
        f"refit is unavailable: {problem}"
        + "; call patchkit.apply_all() before the model loads (the vLLM plugin does this in every"
        " vLLM process), or see `patchkit list` for the supported vLLM versions"
    )
