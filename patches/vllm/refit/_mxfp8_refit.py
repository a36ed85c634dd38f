"""``vllm.mxfp8_refit``: the recording pair every refit patch installs (``_record``); the
format's row in ``_formats`` adds its hook (``_mxfp8_targets.allow_reprocessing``: the fused-MoE
method's processing runs only once per layer upstream).
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
