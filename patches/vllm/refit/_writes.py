"""Count the elements vLLM's weight loaders write in place, paying only for the writes.

Every vLLM weight loader ends in an in-place write into the destination parameter (possibly
narrowed to a shard or an expert): ``copy_`` mostly, item assignment (fused-MoE per-tensor scales),
``fill_`` (``default_weight_loader`` for scalars). Those writes' destinations tell which part of a
parameter a load filled (``_coverage``), whatever the loader's sharding logic.

vLLM's layerwise reload counts ``aten.copy_`` with a ``TorchDispatchMode``
(``model_loader/reload/meta.py``, 0.16+); patchkit used a ``TorchFunctionMode`` before. A mode sees
every torch call inside the loader, and vLLM's fused-MoE loader makes about thirteen per call
(narrow, view, shape reads): on vLLM 0.24 the mode's Python round trips made a refit's load phase
2.6 times vLLM's own (``benchmarks/bench_refit.py --hidden 256``). So only the writes are
intercepted here: while a refit holds the counting (``hold``, from ``prepare`` until ``finish`` or
``abort``), ``torch.Tensor``'s ``copy_``, ``fill_``, ``zero_`` and ``__setitem__`` are wrappers that
call the original and add the elements written to the calling thread's active
:class:`WriteCounter`, if any. Other threads, and code between loader calls (the exporter producing
the stream), pay one thread-local lookup per write and count nothing. When the last hold is
released the inherited methods are back, as they were.

A write reached again through a tensor subclass's ``__torch_function__`` (vLLM's parameters have
one, and torch hands it the ``torch.Tensor`` attribute, i.e. the wrapper) counts once: only the
outermost write of a thread counts.

Not counted: ``out=`` arguments and other in-place ops (``index_copy_``, ``masked_fill_``); no vLLM
loader writes that way (0.24-0.33). A write that is not counted makes the refit fail with "not
loaded in full", loudly; it can never make a short load pass. Code that ``torch.compile`` traces
in another thread while a refit is prepared sees the wrappers (a graph break there).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

_WHOLE_WRITES = ("copy_", "fill_", "zero_")  # the destination is the tensor itself
_ITEM_WRITE = "__setitem__"

_install_lock = threading.Lock()
_holds = 0
_thread = threading.local()  #: ``counter``: the active WriteCounter; ``writing``: inside a write


class WriteCounter:
    """Counts the elements this thread writes in place while the ``with`` block runs.

    Nests: an inner counter hides the outer one until it exits.
    """

    __slots__ = ("copied", "destinations", "_outer", "_hold")

    _hold: Hold | None

    def __init__(self) -> None:
        self.copied = 0
        #: each write's destination and, for an item write, its index (``_coverage`` maps them
        #: onto the parameter written)
        self.destinations: list[tuple[torch.Tensor, Any]] = []

    def __enter__(self) -> WriteCounter:
        # Inside a refit the counting is installed already: then entering changes nothing but this
        # thread's counter, so a signal landing here cannot leave a hold (and torch.Tensor's
        # wrappers) behind. The refit's own hold is taken and released where signals are held.
        self._hold = None if _holds else hold()
        self._outer = getattr(_thread, "counter", None)
        _thread.counter = self
        return self

    def __exit__(self, *exc_info: object) -> None:
        _thread.counter = self._outer
        if self._hold is not None:
            self._hold.release()


class Hold:
    """Keeps the write wrappers installed until :meth:`release` (idempotent)."""

    __slots__ = ("_released",)

    def __init__(self) -> None:
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        _release()


def hold() -> Hold:
    """Install the write wrappers on ``torch.Tensor`` (if no one has) until the hold is released."""
    global _holds
    with _install_lock:
        if _holds == 0:
            for name in _WHOLE_WRITES:
                setattr(torch.Tensor, name, _counting_whole_write(getattr(torch.Tensor, name)))
            setattr(torch.Tensor, _ITEM_WRITE, _counting_item_write(getattr(torch.Tensor, _ITEM_WRITE)))
        _holds += 1
    return Hold()


def _release() -> None:
    global _holds
    with _install_lock:
        _holds -= 1
        if _holds == 0:
            # torch.Tensor inherits these from torch._C.TensorBase; deleting restores that.
            for name in (*_WHOLE_WRITES, _ITEM_WRITE):
                delattr(torch.Tensor, name)
            # A counter an interrupt left active in this thread (its ``with`` never exited) counts
            # nothing from here on.
            _thread.counter = None
            _thread.writing = False


def installed() -> bool:
    return any(name in vars(torch.Tensor) for name in (*_WHOLE_WRITES, _ITEM_WRITE))


def _counting_whole_write(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def write(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counter = getattr(_thread, "counter", None)
        if counter is None or getattr(_thread, "writing", False):
            return original(self, *args, **kwargs)
        try:
            _thread.writing = True  # inside the try: an interrupt cannot leave it set
            result = original(self, *args, **kwargs)
        finally:
            _thread.writing = False
        counter.copied += self.numel()
        counter.destinations.append((self, None))
        return result

    return write


def _counting_item_write(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def write(self: torch.Tensor, index: Any, value: Any) -> None:
        counter = getattr(_thread, "counter", None)
        if counter is None or getattr(_thread, "writing", False):
            original(self, index, value)
            return
        try:
            _thread.writing = True  # inside the try: an interrupt cannot leave it set
            original(self, index, value)
            written = self[index].numel()
        finally:
            _thread.writing = False
        counter.copied += written
        counter.destinations.append((self, index))

    return write
