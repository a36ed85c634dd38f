"""Global Megatron names of a rank's parameters, and the order every rank exports them in.

Megatron names parameters by their position in the local chunk: under pipeline parallelism
``decoder.layers.0`` of stage 1 is global layer ``num_layers / pp``, and under expert parallelism
``experts.local_experts.0`` of EP rank 1 is global expert ``num_experts / ep``. The model knows the
global numbers itself: each ``TransformerLayer`` has its 1-based global ``layer_number`` and each
``MoELayer`` its ``local_expert_indices``; reading them (rather than recomputing offsets) keeps
uneven pipeline splits and VPP chunks right.
"""

from __future__ import annotations

import re
from typing import Iterator

from torch import nn

_LAYER = re.compile(r"^(decoder\.layers\.)(\d+)(\.|$)")
_LOCAL_EXPERT = re.compile(r"(\.experts\.local_experts\.)(\d+)(\.)")
_DIGITS = re.compile(r"(\d+)")
#: Top-level order of a GPT model's parameters, as a single-rank model lists them.
_SECTIONS = ("embedding.", "decoder.layers.", "decoder.final_layernorm.", "output_layer.", "mtp.")


def _global_layer_offsets(chunk: nn.Module) -> dict[int, int]:
    """Local decoder layer index -> global 0-based layer number, from the layers themselves."""
    decoder = getattr(chunk, "decoder", None)
    layers = getattr(decoder, "layers", None) or ()
    return {index: int(getattr(layer, "layer_number", index + 1)) - 1 for index, layer in enumerate(layers)}


def _expert_indices(chunk: nn.Module) -> dict[str, list[int]]:
    """Module path of each MoE layer -> its local experts' global indices."""
    return {
        name: list(module.local_expert_indices)
        for name, module in chunk.named_modules()
        if hasattr(module, "local_expert_indices") and hasattr(module, "experts")
    }


def global_names(chunk: nn.Module, names: Iterator[str] | list[str]) -> dict[str, str]:
    """Local parameter name -> the name it has in the whole (unsharded, single-stage) model."""
    layers = _global_layer_offsets(chunk)
    experts = _expert_indices(chunk)
    result: dict[str, str] = {}
    for name in names:
        renamed = name
        match = _LOCAL_EXPERT.search(name)
        if match:
            owner = name[: match.start()]
            indices = experts.get(owner)
            if indices is not None:
                local = int(match.group(2))
                renamed = f"{name[: match.start()]}{match.group(1)}{indices[local]}{name[match.end(2):]}"
        layer = _LAYER.match(renamed)
        if layer:
            number = layers.get(int(layer.group(2)), int(layer.group(2)))
            renamed = f"{layer.group(1)}{number}{renamed[layer.end(2):]}"
        result[name] = renamed
    return result


def export_order_key(name: str) -> tuple[object, ...]:
    """Sort key shared by every rank: model section, then numbers compared as numbers."""
    section = next((index for index, prefix in enumerate(_SECTIONS) if name.startswith(prefix)), len(_SECTIONS))
    parts = tuple(int(part) if part.isdigit() else part for part in _DIGITS.split(name) if part)
    return (section, tuple((0, p) if isinstance(p, int) else (1, p) for p in parts))
