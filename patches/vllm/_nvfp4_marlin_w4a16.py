"""``ModelOptNvFp4Config.__init__`` taking the W4A16 (Marlin) path for NVFP4 checkpoints.

See ``nvfp4_marlin_w4a16.py``. Only the ``quant_method`` argument changes; vLLM's own constructor
then selects the W4A16 linear method and the MoE ``use_a16`` mode, as for a ``W4A16_NVFP4``
checkpoint.

:func:`as_checkpoint_says` suspends the option in the current thread or task, for code that must
build layers exactly as the checkpoint declares them (the ``vllm.nvfp4_refit`` self-check, which
checks W4A4 layers and runs in the same doctor process as this option).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

W4A4 = "NVFP4"
W4A16 = "W4A16_NVFP4"

_SUSPENDED: contextvars.ContextVar[bool] = contextvars.ContextVar("patchkit_nvfp4_marlin_w4a16_off", default=False)


@contextlib.contextmanager
def as_checkpoint_says() -> Iterator[None]:
    """Within the block, configs built in this thread/task keep the checkpoint's ``quant_method``."""
    token = _SUSPENDED.set(True)
    try:
        yield
    finally:
        _SUSPENDED.reset(token)


def wrap_config_init(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("quant_method") == W4A4 and not _SUSPENDED.get():
            bound.arguments["quant_method"] = W4A16
            logger.info("vllm.nvfp4_marlin_w4a16: serving the NVFP4 checkpoint as W4A16 (Marlin)")
        original(*bound.args, **bound.kwargs)

    return __init__
