"""``FileSystemWriterAsync.get_save_function_and_args`` whose preload copies tensors to the host blocking.

Upstream (0.14-0.19) returns ``(save_fn, partial(self.preload_tensors, self.write_buckets, True),
save_args)``; the preload is rebound with ``non_blocking=False``. Anything else in that slot means
upstream changed the contract, and the save is refused with a typed error rather than run with the
copies the patch was enabled to avoid.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from .._errors import DistCheckpointingError

#: The parameter of ``FileSystemWriterAsync.preload_tensors`` that chooses pinned asynchronous copies.
NON_BLOCKING = "non_blocking"


def blocking_preload(preload_fn: Any) -> Any:
    """``preload_fn`` (upstream's ``partial(preload_tensors, write_buckets, True)``) with ``non_blocking=False``."""
    if preload_fn is None:  # nothing to write on this rank
        return None
    if not isinstance(preload_fn, functools.partial):
        raise DistCheckpointingError(
            f"FileSystemWriterAsync.get_save_function_and_args returned a preload {preload_fn!r}, not the "
            "functools.partial of preload_tensors megatron-core 0.14-0.19 return; the blocking copy cannot "
            "be applied: disable megatron.dist_ckpt_blocking_d2h or report the megatron-core version"
        )
    names = list(inspect.signature(preload_fn.func).parameters)
    if NON_BLOCKING not in names:
        raise DistCheckpointingError(
            f"{getattr(preload_fn.func, '__qualname__', preload_fn.func)} takes no {NON_BLOCKING!r} argument "
            f"(parameters: {names}); the blocking copy cannot be applied"
        )
    position = names.index(NON_BLOCKING)
    args = preload_fn.args[:position]  # drop the positional non_blocking and anything after it
    keywords = {**preload_fn.keywords, NON_BLOCKING: False}
    if len(preload_fn.args) > position + 1:
        keywords.update(zip(names[position + 1:], preload_fn.args[position + 1:]))
    return functools.partial(preload_fn.func, *args, **keywords)


def wrap_get_save_function_and_args(original: Callable[..., Any]) -> Callable[..., Any]:
    """``get_save_function_and_args`` returning a preload that copies device-to-host blocking."""

    @functools.wraps(original)
    def get_save_function_and_args(self: Any) -> Any:
        save_fn, preload_fn, save_args = original(self)
        return save_fn, blocking_preload(preload_fn), save_args

    return get_save_function_and_args
