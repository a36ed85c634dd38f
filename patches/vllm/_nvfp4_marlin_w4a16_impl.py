"""``ModelOptNvFp4Config.__init__`` taking the W4A16 (Marlin) path for NVFP4 checkpoints.

See ``nvfp4_marlin_w4a16.py``. Only the ``quant_method`` argument changes; vLLM's own constructor
then selects the W4A16 linear method and the MoE ``use_a16`` mode, as for a ``W4A16_NVFP4``
checkpoint.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

W4A4 = "NVFP4"
W4A16 = "W4A16_NVFP4"


def wrap_config_init(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("quant_method") == W4A4:
            bound.arguments["quant_method"] = W4A16
            logger.info("vllm.nvfp4_marlin_w4a16: serving the NVFP4 checkpoint as W4A16 (Marlin)")
        original(*bound.args, **bound.kwargs)

    return __init__
