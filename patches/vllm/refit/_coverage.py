"""Which elements of a staged parameter a refit's loaders wrote, and by which loader calls.

A refit is complete when every element of every kept checkpoint parameter was written, each by
exactly one refit tensor. Counting elements is not enough: a tensor sent twice (``up.*`` renamed
``gate.*``, ``experts.1.*`` renamed ``experts.0.*``) writes one half twice and the other not at
all, and the count still adds up. So a refit tracks, per staged parameter:

- the regions written, from the destinations of the in-place writes vLLM's loaders make
  (``_writes`` hands them over): a contiguous destination is a byte range of the parameter's
  storage (what fused linears and fused-MoE loaders write: a shard, an expert); anything else (a
  column slice, a padded corner, an indexed write) marks a byte mask over the storage, made only
  then. A write into another tensor's storage is not the parameter's;
- the loader calls that wrote, by their arguments besides the two tensors (shard id, expert id,
  checkpoint name): a call with the same arguments twice wrote the same region twice. Two
  different calls may share elements where vLLM's loaders map them there (one FP8 MoE input scale
  per expert, written by its gate and its up tensor).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import Any

import torch

#: loader keyword arguments that do not say where a tensor goes
_NOT_WHERE = frozenset({"return_success"})


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable:
    """What says where a loader call writes: its arguments besides the destination and the tensor."""

    def plain(value: Any) -> Hashable:
        return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)

    return (tuple(plain(a) for a in args[2:]),
            tuple(sorted((k, plain(v)) for k, v in kwargs.items()
                         if k not in _NOT_WHERE and k not in ("param", "loaded_weight"))))


def describe_key(key: Hashable) -> str:
    positional, keywords = key  # type: ignore[misc]
    parts = [repr(a) for a in positional] + [f"{k}={v!r}" for k, v in keywords]
    return ", ".join(parts) if parts else "no shard or expert id"


class Coverage:
    """The regions of one staged parameter written during one refit, and the calls that wrote them."""

    __slots__ = ("_ranges", "_mask", "_storage", "calls", "doubled")

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] = []
        self._mask: torch.Tensor | None = None
        self._storage: int | None = None
        self.calls: set[Hashable] = set()
        #: loader-call keys seen more than once
        self.doubled: list[Hashable] = []

    def add(self, param: torch.Tensor, destinations: Iterable[tuple[torch.Tensor, Any]], key: Hashable) -> int:
        """Record one loader call's writes into ``param``; return the elements of ``param`` it wrote."""
        storage = param.untyped_storage()
        pointer = storage.data_ptr()
        self._storage = pointer
        written_bytes = 0
        for tensor, index in destinations:
            if tensor.untyped_storage().data_ptr() != pointer:
                continue
            itemsize = tensor.element_size()
            if index is None and tensor.is_contiguous():
                start = tensor.storage_offset() * itemsize
                self._ranges.append((start, start + tensor.numel() * itemsize))
                written_bytes += tensor.numel() * itemsize
            else:
                written_bytes += self._mark(storage.nbytes(), tensor, index)
        if written_bytes:
            if key in self.calls:
                self.doubled.append(key)
            self.calls.add(key)
        return written_bytes // max(param.element_size(), 1)

    def _mark(self, nbytes: int, tensor: torch.Tensor, index: Any) -> int:
        if self._mask is None:
            self._mask = torch.zeros(nbytes, dtype=torch.bool, device=tensor.device)
        itemsize = tensor.element_size()
        view = self._mask.as_strided(
            (*tensor.shape, itemsize), (*(s * itemsize for s in tensor.stride()), 1), tensor.storage_offset() * itemsize
        )
        if index is not None:
            view = view[index]
        torch._C.TensorBase.fill_(view, True)  # not the refit's counting wrapper: this is no load
        return view.numel()

    def covered_bytes(self, param: torch.Tensor) -> int:
        """How many bytes of ``param``'s storage the loaders wrote, each counted once."""
        if self._storage is None:
            return 0
        if self._mask is not None or any(end > param.untyped_storage().nbytes() for _, end in self._ranges):
            mask = self._mask if self._mask is not None else torch.zeros(
                param.untyped_storage().nbytes(), dtype=torch.bool, device=param.device)
            for start, end in self._ranges:
                torch._C.TensorBase.fill_(mask[start:end], True)
            return int(mask.sum())
        total, reach = 0, 0
        for start, end in sorted(self._ranges):
            start = max(start, reach)
            if end > start:
                total += end - start
                reach = end
        return total

    def missing(self, param: torch.Tensor, required_elements: int) -> int:
        """Elements of the ``required_elements`` a refit must write that no loader wrote."""
        covered = self.covered_bytes(param) // max(param.element_size(), 1)
        return max(0, required_elements - covered)


def expected_counts(loaded: torch.Tensor) -> tuple[int, ...]:
    """The element counts one loader call may write from ``loaded``: all of it, or this rank's share
    of it under tensor parallelism (vLLM's loaders narrow the checkpoint tensor to the rank's slice)."""
    n = loaded.numel()
    tp = _tensor_parallel_size()
    return (n,) if tp == 1 or n % tp else (n, n // tp)


def _tensor_parallel_size() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_world_size())
    except Exception:  # no parallel state set up: one rank
        return 1


def numel(shape: Iterable[int]) -> int:
    return math.prod(shape)
