"""``vllm.mxfp8_refit``: the recording pair every refit patch installs (``_refit_record``); the
format's row in ``_refit_formats`` adds its hook (``_mxfp8_targets.allow_reprocessing``: the fused-MoE
method's processing runs only once per layer upstream).
"""

from __future__ import annotations

from ._refit_record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
