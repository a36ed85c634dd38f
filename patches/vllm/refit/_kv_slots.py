"""The KV-cache scale tensors attention kernels read, kept in place through a refit's KV-scale processing.

vLLM's ``BaseKVCacheMethod.process_weights_after_loading`` copies loaded scales into the attention
layer's ``_k_scale``/``_v_scale``/``_q_scale``/``_prob_scale`` buffers in place. The compressed-tensors
KV-cache method (``CompressedTensorsKVCacheMethod``) puts new tensors in those slots instead: 0.24 and
0.29 assign the loaded ``k_scale`` *parameter* (``layer._k_scale = layer.k_scale``, which makes the slot
a parameter), 0.33 registers its detached tensor as a new buffer. A refit that ran it as is would leave
kernels and captured CUDA graphs reading the old tensors. :class:`ServedScales` remembers each slot's
tensor and kind before processing and afterwards copies the new values into the old tensors and puts
them back, undoably (``_commit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .._errors import RefitError
from ._commit import CommitUndo
from ._state import describe_tensor

#: the attention layer's serving scale slots
SERVED_SCALE_NAMES = ("_q_scale", "_k_scale", "_v_scale", "_prob_scale")


@dataclass(frozen=True)
class _Slot:
    tensor: torch.Tensor
    kind: str  #: "parameter", "buffer" or "attribute"
    persistent: bool


@dataclass
class ServedScales:
    """One attention layer's serving scale tensors, by slot, as they were before processing."""

    layer: torch.nn.Module
    slots: dict[str, _Slot]

    @classmethod
    def of(cls, layer: torch.nn.Module) -> ServedScales:
        slots = {}
        for name in SERVED_SCALE_NAMES:
            kind, tensor = _current(layer, name)
            if tensor is not None:
                persistent = name not in layer._non_persistent_buffers_set
                slots[name] = _Slot(tensor, kind, persistent)
        return cls(layer, slots)

    def keep(self, layer_name: str, undo: CommitUndo) -> None:
        """After processing: each slot's new values copied into its old tensor, which is put back."""
        for name, slot in self.slots.items():
            _, new = _current(self.layer, name)
            if new is None or new is slot.tensor:
                continue
            if new.shape != slot.tensor.shape or new.dtype != slot.tensor.dtype:
                raise RefitError(
                    f"refit of layer {layer_name!r}: KV-cache scale {name!r} is {describe_tensor(slot.tensor)}"
                    f" but processing produced {describe_tensor(new)}",
                    layer=layer_name,
                    parameter=name,
                    expected=describe_tensor(slot.tensor),
                    got=describe_tensor(new),
                )
            undo.copy(slot.tensor, new.detach())
        self.put_back()

    def put_back(self) -> None:
        """Make the remembered tensors the layer's slots again, each of its former kind."""
        layer = self.layer
        for name, slot in self.slots.items():
            layer._parameters.pop(name, None)
            layer._buffers.pop(name, None)
            layer.__dict__.pop(name, None)
            if slot.kind == "parameter":
                layer._parameters[name] = slot.tensor  # type: ignore[assignment]
            elif slot.kind == "buffer":
                layer._buffers[name] = slot.tensor
                if slot.persistent:
                    layer._non_persistent_buffers_set.discard(name)
                else:
                    layer._non_persistent_buffers_set.add(name)
            else:
                object.__setattr__(layer, name, slot.tensor)


def _current(layer: torch.nn.Module, name: str) -> tuple[str, Any]:
    if layer._parameters.get(name) is not None:
        return "parameter", layer._parameters[name]
    if layer._buffers.get(name) is not None:
        return "buffer", layer._buffers[name]
    value = layer.__dict__.get(name)
    return ("attribute", value) if isinstance(value, torch.Tensor) else ("attribute", None)
