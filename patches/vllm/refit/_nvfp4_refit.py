"""``vllm.nvfp4_refit``: ModelOpt NVFP4 layers (and, from vLLM 0.30, every ModelOpt linear layer) are
recorded by the recording pair every refit patch installs (``_record``), driven by their row in
the format table (``_formats``); they need no hook.
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
