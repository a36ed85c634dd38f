"""Weight-loader wrappers that count what vLLM's loaders write during a refit.

Every vLLM weight loader ends in an in-place write into the destination parameter (possibly
narrowed to a shard or an expert): ``copy_`` mostly, item assignment (fused-MoE per-tensor scales),
``fill_`` (``default_weight_loader`` for scalars). Counting the elements those writes cover tells
how much of a parameter a load filled, whatever the loader's sharding logic. vLLM's layerwise
reload counts ``aten.copy_`` with a ``TorchDispatchMode`` (``model_loader/reload/meta.py``, 0.16+);
patchkit counts one level up, with a ``TorchFunctionMode``: it sees each Python-level call once
instead of every aten op the call decomposes into, at a fraction of the per-op cost. With a
dispatch mode the counting was most of the refit's overhead over a first load on vLLM 0.33
(whose fused-MoE loader runs several ops per call): ``benchmarks/bench_refit.py``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ._refit_state import LoadLog

# What a vLLM loader raises for a tensor it cannot place (shape asserts, narrow/copy errors).
LOADER_ERRORS = (AssertionError, ValueError, RuntimeError, IndexError)

# In-place writes whose destination is the tensor itself.
_WHOLE_WRITES = frozenset({torch.Tensor.copy_, torch.Tensor.fill_, torch.Tensor.zero_})
_SETITEM = torch.Tensor.__setitem__


class WriteCounter(TorchFunctionMode):
    """Counts elements written in place (``copy_``, ``fill_``, ``zero_``, ``t[i] = v``, ``out=``) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.copied = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        # The mode is off inside its own handler: the indexing below is not counted again.
        if func in _WHOLE_WRITES:
            self.copied += args[0].numel()
        elif func is _SETITEM:
            self.copied += args[0][args[1]].numel()
        elif isinstance(out := kwargs.get("out"), torch.Tensor):
            self.copied += out.numel()
        return result


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

    @functools.wraps(original)
    def counting_loader(*args: Any, **kwargs: Any) -> Any:
        # Destination and incoming tensor come first; almost every caller passes them positionally.
        target, loaded_weight = args[:2] if len(args) >= 2 else _first_two(original, args, kwargs)
        if check is not None:
            check(target, loaded_weight)
        try:
            with WriteCounter() as counter:
                result = original(*args, **kwargs)
        except LOADER_ERRORS as exc:
            if on_error is None:
                raise
            raise on_error(target, loaded_weight, exc) from exc
        log.record(name, counter.copied, target.numel(), tuple(loaded_weight.shape))
        return result

    set_loader(param, counting_loader)


def _first_two(loader: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The first two arguments of a call made (partly) by keyword, by the loader's parameter names."""
    first, second = _parameter_names(getattr(loader, "__func__", loader), hasattr(loader, "__self__"))
    bound = dict(zip((first, second), args, strict=False))  # fewer than two positional
    return bound.get(first, kwargs.get(first)), bound.get(second, kwargs.get(second))


@functools.lru_cache(maxsize=256)
def _parameter_names(function: Callable[..., Any], bound: bool) -> tuple[str, str]:
    names = list(inspect.signature(function).parameters)[1 if bound else 0:]
    return names[0], names[1]


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
