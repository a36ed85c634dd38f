"""``_allreduce_non_tensor_model_parallel_grads`` run once per chunk of parameters of bounded size.

Upstream's function walks every model chunk's ``named_parameters``, keeps the parameters whose
gradients are replicated across the tensor-parallel group, and all-reduces them coalesced. The
wrapper splits the parameters into chunks first and calls upstream's function on a view of each
chunk: a model chunk whose ``named_parameters`` yields only that chunk's parameters (and whose
``ddp_config`` is the model chunk's). Upstream still decides which gradients to reduce, with which
op, and how to write them back (DTensor, Megatron FSDP); the wrapper only bounds what one call sees.

Chunks are sized by the gradients upstream's rules select (:func:`reduced_by_upstream`); the other
parameters cost nothing and ride along in whichever chunk they fall, so a parameter a later release
adds to upstream's rules is still reduced, only not counted.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from patchkit.runtime import settings

logger = logging.getLogger(__name__)

_configured: int | None = None


def configure_chunk_bytes(chunk_bytes: int | None) -> None:
    """Set the most bytes one all-reduce carries in this process; None goes back to
    ``PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES`` (default 1 GiB)."""
    global _configured
    if chunk_bytes is not None and (isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int)
                                    or chunk_bytes <= 0):
        raise ValueError(f"chunk_bytes must be a positive int or None; got {chunk_bytes!r}")
    _configured = chunk_bytes


def chunk_bytes() -> int:
    """The most bytes one all-reduce carries: :func:`configure_chunk_bytes`, else the environment."""
    return _configured if _configured is not None else settings.grad_allreduce_chunk_bytes()


class Entry(NamedTuple):
    """One parameter of one model chunk, in upstream's walking order."""

    model_chunk: int
    name: str
    param: Any


class ParameterView:
    """A model chunk as upstream's function sees it: its ``ddp_config`` and only some parameters."""

    def __init__(self, ddp_config: Any, named: list[tuple[str, Any]]) -> None:
        self.ddp_config = ddp_config
        self._named = named

    def named_parameters(self) -> Iterator[tuple[str, Any]]:
        return iter(self._named)


def reduced_by_upstream(name: str, param: Any, config: Any) -> bool:
    """Whether upstream's function (0.14-0.19) all-reduces this parameter's gradient."""
    if getattr(param, "average_gradients_across_tp_domain", False):
        return True
    return bool((config.sequence_parallel and getattr(param, "sequence_parallel", False))
                or (config.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)))


def grad_bytes(param: Any, ddp_config: Any) -> int:
    """Bytes of the gradient upstream would coalesce for ``param`` (0 when it has none)."""
    grad = getattr(param, "main_grad" if hasattr(param, "main_grad") else "grad", None)
    if grad is None:
        return 0
    if getattr(ddp_config, "use_megatron_fsdp", False):
        grad = getattr(grad, "_local_tensor", grad)
    return int(grad.numel()) * int(grad.element_size())


def walk(model: Iterable[Any]) -> tuple[list[Any], list[Entry]]:
    """Each model chunk's ``ddp_config`` and every trainable parameter, as upstream walks them."""
    from megatron.core.utils import get_attr_wrapped_model

    configs, entries = [], []
    for index, model_chunk in enumerate(model):
        configs.append(model_chunk.ddp_config)
        for name, param in get_attr_wrapped_model(model_chunk, "named_parameters")():
            if param.requires_grad:
                entries.append(Entry(index, name, param))
    return configs, entries


def split(entries: list[Entry], sizes: list[int], limit: int) -> list[list[Entry]]:
    """Consecutive chunks whose sizes add up to at most ``limit``; an entry larger than ``limit`` alone."""
    chunks: list[list[Entry]] = []
    current: list[Entry] = []
    filled = 0
    for entry, size in zip(entries, sizes, strict=True):
        if size and filled and filled + size > limit:
            chunks.append(current)
            current, filled = [], 0
        current.append(entry)
        filled += size
    if current:
        chunks.append(current)
    return chunks


def plan(model: Iterable[Any], config: Any, limit: int) -> list[list[ParameterView]]:
    """The views upstream's function is called with, one list of model-chunk views per call."""
    configs, entries = walk(model)
    sizes = [grad_bytes(e.param, configs[e.model_chunk]) if reduced_by_upstream(e.name, e.param, config) else 0
             for e in entries]
    calls = []
    for chunk in split(entries, sizes, limit):
        by_model_chunk: dict[int, list[tuple[str, Any]]] = {}
        for entry in chunk:
            by_model_chunk.setdefault(entry.model_chunk, []).append((entry.name, entry.param))
        calls.append([ParameterView(configs[index], named) for index, named in by_model_chunk.items()])
    return calls


def wrap_allreduce(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_allreduce_non_tensor_model_parallel_grads`` that calls ``original`` once per chunk."""

    @functools.wraps(original)
    def allreduce(model: Any, config: Any, tp_group: Any = None) -> Any:
        if tp_group is None:
            from megatron.core import parallel_state

            tp_group = parallel_state.get_tensor_model_parallel_group()
        if tp_group.size() <= 1:
            return original(model, config, tp_group)
        calls = plan(model, config, chunk_bytes())
        if len(calls) > 1:
            logger.debug("patchkit: tensor-parallel gradient all-reduce in %d chunks", len(calls))
        for views in calls:
            original(views, config, tp_group)
        return None

    return allreduce
