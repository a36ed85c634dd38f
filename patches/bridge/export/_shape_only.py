"""Shape-only tensor collectives and allocations, for the calling thread, for the length of a block.

Bridge's export calls ``torch.distributed.all_gather`` (TP and EP gathers), ``torch.distributed.broadcast``
(PP owner to the other stages) and ``torch.empty`` (the receiving stages' buffers) by attribute, from its
mapping classes and from model-specific bridges. Run on ``meta`` parameters, the gathers' outputs are
``meta`` already (``torch.empty_like`` of a meta tensor), so a gather has nothing to move: the shapes
follow from the meta tensors alone. :func:`shape_only` makes those calls shape-only:

* the calls are gated by a thread-local depth: in any other thread, or in this thread outside the
  block, every wrapped function delegates to the original unchanged, so a trainer thread's collectives
  are never skipped (the race a process-wide swap has);
* the wrappers are installed when the first block in the process opens and removed when the last one
  closes (whatever the block raised), so outside every block torch's own functions are in place;
* a wrapper is removed only while it is still the attribute: if someone wrapped over it meanwhile, theirs
  stays (and keeps calling ours, which then delegates), and the refusal is logged.

Object collectives (``all_gather_object``, ``broadcast_object_list``) run for real, with the block
suspended while they do (they allocate their byte buffers with ``torch.empty``): with pipeline
parallelism Bridge exchanges each tensor's (shape, dtype) through them, which is how a stage learns the
shape of a tensor another stage owns. With one pipeline stage they only reach the stage's own group of
one (Bridge 0.6 gathers its adapter list over the pipeline group in every export).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed

logger = logging.getLogger(__name__)

#: The tensor collectives a shape-only block skips, by the module attribute Bridge calls them through.
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "broadcast", "scatter", "all_reduce", "reduce_scatter_tensor")
#: The allocator a shape-only block sends to the meta device (the PP receivers' buffers).
ALLOCATORS = ("empty",)
#: Collectives of Python objects, which run for real with the block suspended.
OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list")

_state = threading.local()
_lock = threading.Lock()
_blocks = 0
#: (module, attribute) -> (original, wrapper) while at least one block is open.
_installed: dict[tuple[Any, str], tuple[Callable[..., Any], Callable[..., Any]]] = {}


def active() -> bool:
    """Whether the calling thread is inside a :func:`shape_only` block."""
    return getattr(_state, "depth", 0) > 0


def _skipped_collective(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if active():
            return None  # meta tensors hold no data: nothing to send or receive
        return original(*args, **kwargs)

    return collective


def _meta_allocator(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def allocate(*args: Any, **kwargs: Any) -> Any:
        if active() and kwargs.get("out") is None:
            kwargs["device"] = "meta"
            kwargs.pop("pin_memory", None)
        return original(*args, **kwargs)

    return allocate


def _unblocked_object_collective(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def object_collective(*args: Any, **kwargs: Any) -> Any:
        depth = getattr(_state, "depth", 0)
        _state.depth = 0
        try:
            return original(*args, **kwargs)
        finally:
            _state.depth = depth

    return object_collective


def _targets() -> list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]]:
    targets: list[tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = [
        (torch.distributed, name, _skipped_collective) for name in COLLECTIVES if hasattr(torch.distributed, name)]
    targets += [(torch.distributed, name, _unblocked_object_collective)
                for name in OBJECT_COLLECTIVES if hasattr(torch.distributed, name)]
    targets += [(torch, name, _meta_allocator) for name in ALLOCATORS]
    return targets


def _install() -> None:
    for module, name, factory in _targets():
        original = getattr(module, name)
        wrapper = factory(original)
        setattr(module, name, wrapper)
        _installed[(module, name)] = (original, wrapper)


def _uninstall() -> None:
    for (module, name), (original, wrapper) in list(_installed.items()):
        if getattr(module, name) is wrapper:
            setattr(module, name, original)
        else:
            logger.warning("%s.%s was wrapped again during a shape-only export; leaving the other wrapper "
                           "in place (ours delegates to torch outside shape-only blocks)", module.__name__, name)
        del _installed[(module, name)]


@contextlib.contextmanager
def shape_only() -> Iterator[None]:
    """Inside the block, in this thread: the tensor collectives do nothing and ``torch.empty`` gives meta."""
    global _blocks
    with _lock:
        if _blocks == 0:
            _install()
        _blocks += 1
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
        with _lock:
            _blocks -= 1
            if _blocks == 0:
                _uninstall()
