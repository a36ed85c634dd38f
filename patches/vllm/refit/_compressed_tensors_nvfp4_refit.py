"""``vllm.compressed_tensors_nvfp4_refit``: the recording pair every refit patch installs
(``_record``) on the generic ``CompressedTensorsLinearMethod``; the format table
(``_formats``) takes a layer only when its ``layer.scheme`` is the NVFP4 one, so a layer of any
other scheme goes straight to upstream, unrecorded, and a refit refuses it.
"""

from __future__ import annotations

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_process_weights_after_loading"]
