"""``vllm.compressed_tensors_nvfp4_moe_refit``: the recording pair every refit patch installs
(``_record``), and, on vLLM 0.24-0.28, ``use_a16`` kept on ``CompressedTensorsW4A4Nvfp4MoEMethod``
as 0.29+ do.

Upstream (``compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py``): ``__init__(moe, layer_name=None,
use_a16=False)`` picks the backend with ``activation_key=None if use_a16 else kNvfp4Dynamic`` and, before
0.29, forgets the flag. ``create_weights`` registers ``w13/w2_input_global_scale`` either way, and an
NVFP4A16 checkpoint carries none: vLLM's first load leaves them as ``torch.empty`` made them and Marlin
never reads them. A refit must know they are placeholders (``_placeholders``), so the flag is kept
where 0.29 keeps it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ._record import wrap_create_weights, wrap_process_weights_after_loading

__all__ = ["wrap_create_weights", "wrap_init", "wrap_process_weights_after_loading"]


def wrap_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: upstream's ``__init__``, then ``self.use_a16`` as it was passed."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        self.use_a16 = bool(bound.arguments.get("use_a16", False))

    return __init__
