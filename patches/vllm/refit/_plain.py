"""All-or-nothing for the tensors a refit writes in place ("plain" tensors).

Recorded quantized layers are staged: their refit tensors land in fresh parameters and reach the kernel tensors
only at commit. Every other tensor vLLM's loaders write — norms, embeddings, the output layer, the
router, unquantized linear and fused-MoE layers, the bias of a recorded layer, persistent buffers —
is written in place by its own ``weight_loader`` as the stream goes by. So for the length of a
refit each such tensor's loader is wrapped: before the tensor's first write in this refit its data
is copied aside; ``abort`` copies the data back (newest copy first, so tensors sharing storage come
back right) and ``release`` (on success) drops the copies. Either way the original loaders are put
back exactly as they were (attribute present or absent).

Cost: one copy of each plain tensor the refit actually writes, on the tensor's own device, held
until the refit finishes or aborts (tensors the stream does not touch cost nothing), and one
device-to-device copy of each per refit. For a typical LLM that is the embedding and output layer
plus the norms, next to the checkpoint-format copy of every recorded layer the staging holds anyway.

Covered: every write made through a tensor's ``weight_loader`` (how vLLM's ``load_weights``,
``AutoWeightsLoader`` and the per-model loaders write; tensors without a loader get
``default_weight_loader``, as ``AutoWeightsLoader`` gives them). Not covered: code that writes a
parameter's ``.data`` directly, bypassing its loader.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from ._loaders import get_loader, loader_arguments, refuse_without_data

#: where the guard of a prepared refit lives on the model
GUARD_ATTR = "_patchkit_plain_refit_guard"

_MISSING = object()


@dataclass
class _WrappedLoader:
    tensor: torch.Tensor
    key: str  #: ``_weight_loader`` (vLLM parameter classes) or ``weight_loader``
    original: Any  #: the attribute's value before the refit, or ``_MISSING``


@dataclass
class PlainGuard:
    """The plain tensors of one refit: their wrapped loaders and the copies taken so far."""

    wrapped: list[_WrappedLoader] = field(default_factory=list)
    backups: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    _saved: set[int] = field(default_factory=set)

    def wrap(self, tensor: torch.Tensor, layer_name: str, name: str) -> None:
        original_loader = get_loader(tensor)
        key = "_weight_loader" if "_weight_loader" in tensor.__dict__ else "weight_loader"
        self.wrapped.append(_WrappedLoader(tensor, key, tensor.__dict__.get(key, _MISSING)))

        @functools.wraps(original_loader)
        def backing_up_loader(*args: Any, **kwargs: Any) -> Any:
            # Before the copy aside, before vLLM's loader: a meta tensor is refused unread.
            refuse_without_data(layer_name, name, tensor, loader_arguments(original_loader, args, kwargs)[1])
            self.save(tensor)
            return original_loader(*args, **kwargs)

        tensor.__dict__[key] = backing_up_loader

    @torch.no_grad()
    def save(self, tensor: torch.Tensor) -> None:
        """Copy ``tensor`` aside unless this refit already did."""
        if id(tensor) in self._saved:
            return
        self.backups.append((tensor, tensor.detach().clone()))
        self._saved.add(id(tensor))

    def copied_bytes(self) -> int:
        return sum(copy.numel() * copy.element_size() for _, copy in self.backups)

    @torch.no_grad()
    def restore(self) -> None:
        """Put back every tensor's data as it was at prepare, then the original loaders."""
        try:
            for tensor, copy in reversed(self.backups):
                tensor.data.copy_(copy)
        finally:
            self.release()

    def release(self) -> None:
        """Drop the copies and put the original loaders back."""
        for entry in self.wrapped:
            if entry.original is _MISSING:
                entry.tensor.__dict__.pop(entry.key, None)
            else:
                entry.tensor.__dict__[entry.key] = entry.original
        self.wrapped.clear()
        self.backups.clear()
        self._saved.clear()


def guard(model: torch.nn.Module, staged: Iterable[torch.Tensor]) -> PlainGuard:
    """Wrap the loader of every loadable tensor of ``model`` that is not ``staged``."""
    skip = {id(t) for t in staged}
    result = PlainGuard()
    try:
        for layer_name, name, tensor in _loadable_tensors(model):
            if id(tensor) not in skip:
                skip.add(id(tensor))  # tied weights: one wrapper, one copy
                result.wrap(tensor, layer_name, name)
    except BaseException:
        result.release()
        raise
    return result


def _loadable_tensors(model: torch.nn.Module) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Parameters and persistent buffers, with their module's name and their own: what
    ``AutoWeightsLoader`` may write."""
    for layer_name, module in model.named_modules():
        for name, param in module._parameters.items():
            if param is not None:
                yield layer_name, name, param
        for name, buffer in module._buffers.items():
            if buffer is not None and name not in module._non_persistent_buffers_set:
                yield layer_name, name, buffer


def install(model: torch.nn.Module, plain: PlainGuard) -> None:
    object.__setattr__(model, GUARD_ATTR, plain)


def take(model: torch.nn.Module) -> PlainGuard | None:
    """The guard of the prepared refit on ``model``, removed from it (None if there is none)."""
    return model.__dict__.pop(GUARD_ATTR, None)


def is_prepared(model: torch.nn.Module) -> bool:
    return GUARD_ATTR in model.__dict__

