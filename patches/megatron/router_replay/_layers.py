"""Router keys in global layer order: decoder layers by their number, then MTP depths (``"mtp.<depth>"``).

What the model-scoped replay object, the pipeline gather and callers merging per-stage records share.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Union

import torch

from .._errors import RouterReplayError

LayerKey = Union[int, str]


def layer_order(key: LayerKey) -> tuple[int, int]:
    """Decoder layers by number, then MTP depths."""
    if isinstance(key, int):
        return (0, key)
    return (1, int(str(key).split(".", 1)[1]))


def merge_layers(parts: Iterable[Mapping[LayerKey, torch.Tensor]]) -> dict[LayerKey, torch.Tensor]:
    """Union of per-chunk / per-stage ``{key: indices}`` mappings, in global layer order."""
    merged: dict[LayerKey, torch.Tensor] = {}
    for part in parts:
        for key, value in part.items():
            if key in merged:
                raise RouterReplayError(f"layer {key!r} appears in two of the merged parts")
            merged[key] = value
    return {key: merged[key] for key in sorted(merged, key=layer_order)}


def stack_layers(by_layer: Mapping[LayerKey, torch.Tensor]) -> tuple[list[LayerKey], torch.Tensor]:
    """``(keys, [tokens, L, topk])`` in global layer order: what ``unpack`` turns into per-sample rows."""
    keys = sorted(by_layer, key=layer_order)
    return keys, torch.stack([by_layer[key] for key in keys], dim=1)
