"""Weight-loader wrappers that count what vLLM's loaders write during a refit (``_writes``), and
the check every refit loader makes of the incoming tensor before vLLM's loader sees it."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .._errors import RefitDeviceError, RefitError
from ._coverage import call_key, expected_counts
from ._state import LoadLog, describe_tensor
from ._writes import WriteCounter

# What a vLLM loader raises for a tensor it cannot place (shape asserts, narrow/copy errors).
LOADER_ERRORS = (AssertionError, ValueError, RuntimeError, IndexError)


def counting_loader(
    original: Callable[..., Any],
    name: str,
    log_of: Callable[[], LoadLog],
    capacity: int,
    *,
    check: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
    on_error: Callable[[torch.Tensor, torch.Tensor, Exception], Exception] | None = None,
) -> Callable[..., Any]:
    """``original``, counting the elements each call writes into ``log_of()[name]`` (at most ``capacity``)
    and which regions of the destination parameter it wrote, under which call arguments
    (``_coverage``). A call that writes more or fewer elements of the parameter than the refit
    tensor has (or, under tensor parallelism, than its rank's share) is refused: vLLM's fused-linear
    loaders narrow an oversized tensor to the shard and copy on without a word.

    The log is looked up per call, so one wrapper serves every refit of a parameter. Nothing here
    reads the destination's attributes: on a vLLM parameter each read is a ``__torch_function__``
    round trip, and this runs once per checkpoint tensor.
    """

    @functools.wraps(original)
    def loader(*args: Any, **kwargs: Any) -> Any:
        target, loaded_weight = loader_arguments(original, args, kwargs)
        if check is not None:
            check(target, loaded_weight)
        try:
            with WriteCounter() as counter:
                result = original(*args, **kwargs)
        except LOADER_ERRORS as exc:
            if on_error is None:
                raise
            raise on_error(target, loaded_weight, exc) from exc
        log = log_of()
        log.record(name, counter.copied, capacity, tuple(loaded_weight.shape))
        written = log.coverage_of(name).add(target, counter.destinations, call_key(args, kwargs))
        if written and isinstance(loaded_weight, torch.Tensor) and written not in expected_counts(loaded_weight):
            problem = ValueError(
                f"the loader wrote {written} elements of the parameter from a refit tensor of"
                f" {loaded_weight.numel()}: the tensor is {'larger' if loaded_weight.numel() > written else 'smaller'}"
                " than the part of the parameter it fills"
            )
            if on_error is None:
                raise RefitError(f"parameter {name!r}: {problem}", parameter=name,
                                 got=describe_tensor(loaded_weight)) from problem
            raise on_error(target, loaded_weight, problem) from problem
        return result

    return loader


def loader_arguments(loader: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """The destination and the incoming tensor of a call to the weight loader ``loader``."""
    # They come first; almost every caller passes them positionally.
    return (args[0], args[1]) if len(args) >= 2 else _first_two(loader, args, kwargs)


def refuse_without_data(layer_name: str, name: str, target: torch.Tensor, loaded_weight: Any) -> None:
    """Raise :class:`RefitDeviceError` for a refit tensor that holds no data (``meta``).

    Any other device is loaded: vLLM's loaders ``copy_`` across devices, as when vLLM reads a
    checkpoint (host tensors into GPU parameters). A meta tensor would fail somewhere inside vLLM's
    loader, with whatever its first read of the tensor raises (``copy_``'s bare
    ``NotImplementedError``, ``.item()``'s ``RuntimeError``) and after whatever it did before that
    read, so it is refused here, by name, before the loader runs.
    """
    if not (isinstance(loaded_weight, torch.Tensor) and loaded_weight.is_meta):
        return
    expected = f"{describe_tensor(target)} on {target.device}"
    got = f"{describe_tensor(loaded_weight)} on meta"
    raise RefitDeviceError(
        f"refit of layer {layer_name!r}: parameter {name!r} is {expected} but the refit tensor is {got}: it"
        " holds no data to load; materialise it (on the host or any GPU) before the refit",
        layer=layer_name,
        parameter=name,
        expected=expected,
        got=got,
        device=str(loaded_weight.device),
    )


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
