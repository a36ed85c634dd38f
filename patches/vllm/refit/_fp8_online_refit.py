"""``vllm.fp8_online_refit``: online-FP8 layers are recorded by the recording pair every refit patch installs
(``_record``), driven by their row in the format table (``_formats``), whose hook lets upstream's once-only
processing run again for a refit (``_fp8_online_targets``).
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
