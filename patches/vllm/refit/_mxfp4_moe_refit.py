"""``vllm.mxfp4_moe_refit``: the recording pair every refit patch installs (``_record``); the
format's row in ``_formats`` adds its hooks (``_mxfp4_targets``: only the MARLIN and TRITON backends
are recorded, the checkpoint's shape of each parameter vLLM padded, and Triton's triton_kernels tensors).
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
