"""Weight-loader wrappers that count what vLLM's loaders write during a refit.

Every vLLM weight loader ends in a ``copy_`` into the destination parameter (possibly narrowed to a
shard or an expert), so counting the elements ``copy_`` writes tells how much of a parameter a
load filled, whatever the loader's sharding logic. vLLM's layerwise reload counts the same way
(``model_loader/reload/meta.py``, 0.16+).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._refit_state import LoadLog

# What a vLLM loader raises for a tensor it cannot place (shape asserts, narrow/copy errors).
LOADER_ERRORS = (AssertionError, ValueError, RuntimeError, IndexError)


class CopyCounter(TorchDispatchMode):
    """Counts elements written by ``aten.copy_`` while active."""

    def __init__(self) -> None:
        super().__init__()
        self.copied = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.copy_.default:
            self.copied += args[0].numel()
        return func(*args, **(kwargs or {}))


def wrap_counting_loader(
    param: torch.nn.Parameter,
    name: str,
    log: LoadLog,
    *,
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    on_error: Callable[[torch.Tensor, torch.Tensor, Exception], Exception] | None = None,
) -> None:
    """Replace ``param``'s loader by one that calls it, counting into ``log[name]``.

    ``check(param, tensor)`` runs before the original loader; ``on_error`` turns a loader error
    into the exception to raise instead.
    """
    original = get_loader(param)
    # Loaders are called positionally (linear, KV scales) or by keyword (fused MoE); the first two
    # parameters are always the destination and the incoming tensor.
    signature = inspect.signature(original)

    @functools.wraps(original)
    def counting_loader(*args: Any, **kwargs: Any) -> Any:
        target, loaded_weight = list(signature.bind(*args, **kwargs).arguments.values())[:2]
        if check is not None:
            check(target, loaded_weight)
        try:
            with CopyCounter() as counter:
                result = original(*args, **kwargs)
        except LOADER_ERRORS as exc:
            if on_error is None:
                raise
            raise on_error(target, loaded_weight, exc) from exc
        log.record(name, counter.copied, target.numel(), tuple(loaded_weight.shape))
        return result

    set_loader(param, counting_loader)


def get_loader(param: torch.Tensor) -> Callable[..., Any]:
    loader = getattr(param, "weight_loader", None)
    if loader is None:
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        loader = default_weight_loader
    return loader


def set_loader(param: torch.Tensor, loader: Callable[..., Any]) -> None:
    # BasevLLMParameter keeps its loader in `_weight_loader` behind a property (with a setter only
    # in newer releases); plain Parameters (KV scales, older MoE) carry a plain attribute.
    if "_weight_loader" in param.__dict__:
        param._weight_loader = loader
    else:
        param.weight_loader = loader
