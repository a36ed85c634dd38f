"""The commit of a refit, all-or-nothing: what each write overwrote, kept until the last write is done.

The commit copies each layer's new kernel tensors into the tensors the model serves (CUDA graphs
hold their addresses) and runs the KV-cache method's processing, which writes the ``_k_scale``/...
buffers in place. A failure part-way (a device error in a copy, upstream processing raising for one
attention layer) would leave the layers before it new and the rest old. So every write goes through
a :class:`CommitUndo`: before a tensor is overwritten its value is copied aside, and if anything
raises before :meth:`CommitUndo.discard`, :meth:`CommitUndo.rollback` copies the saved values back,
newest first (tensors sharing storage come back right), and runs the undo steps registered for the
layers' Python attributes.

Memory: a layer's saved copies take the place of its new kernel tensors, which the caller drops once
the layer is committed; the peak is what the refit holds before the commit plus one layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CommitUndo:
    """What one commit has overwritten so far, and how to put it back."""

    def __init__(self) -> None:
        self._steps: list[Callable[[], None]] = []

    @torch.no_grad()
    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """``target.copy_(source)``, undoable; a copy that fails half-way is undone too."""
        saved = target.detach().clone()
        self._steps.append(lambda: target.data.copy_(saved))  # before the write: a torn copy is undone
        target.data.copy_(source)

    @torch.no_grad()
    def save_scales(self, layer: torch.nn.Module, after: Callable[[], None]) -> None:
        """Before upstream processing writes an attention layer's scales in place: its scale buffers
        and tensors (values) and plain scale attributes (``_k_scale_float``...) come back on undo,
        then ``after`` runs (what the layer's refit left behind)."""
        tensors = [(t, t.detach().clone()) for t in _scale_tensors(layer)]
        values = {name: value for name, value in vars(layer).items()
                  if "scale" in name and not isinstance(value, torch.Tensor)}

        def undo() -> None:
            for tensor, saved in tensors:
                tensor.data.copy_(saved)
            for name, value in values.items():
                object.__setattr__(layer, name, value)
            after()

        self._steps.append(undo)

    def rollback(self) -> None:
        """Undo every step, newest first; every step runs even if one fails (the first error is raised)."""
        steps, self._steps = self._steps, []
        error: BaseException | None = None
        for step in reversed(steps):
            try:
                step()
            except BaseException as exc:  # noqa: PERF203 - each step must run
                error = error or exc
        if error is not None:
            raise error

    def discard(self) -> None:
        """The commit is complete: drop the saved values."""
        self._steps.clear()


def _scale_tensors(layer: torch.nn.Module) -> list[torch.Tensor]:
    """The layer's scale tensors that processing may write in place (not the checkpoint parameters)."""
    found: dict[int, torch.Tensor] = {}
    candidates: list[tuple[str, Any]] = [*layer._buffers.items(), *vars(layer).items()]
    for name, value in candidates:
        if "scale" in name and isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
            found.setdefault(id(value), value)
    return list(found.values())
