"""``vllm.fp8_online_moe_refit``: vLLM 0.24's ``Fp8OnlineMoEMethod`` layers are recorded by the recording
pair every refit patch installs (``_record``), driven by their row in the format table (``_formats``).
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
