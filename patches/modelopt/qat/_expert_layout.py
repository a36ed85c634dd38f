"""How quantized MoE experts are named in the export stream: per expert (Hugging Face / ModelOpt) or fused.

- ``per_expert`` (the default): ``<moe>.experts.<e>.{gate,up,down}_proj.{weight,weight_scale,
  weight_scale_2,input_scale}``, the names of ModelOpt's own NVFP4 Hugging Face checkpoints and of
  the RL frameworks' exporters. vLLM's model ``load_weights`` maps them onto its fused-MoE
  parameters through the model's expert mapping, so a stream in this layout can be handed to
  ``model.load_weights`` (or patchkit's ``refit_weights``) or written as a checkpoint.
- ``fused``: one layer's experts stacked into vLLM's ``FusedMoE`` parameter names,
  ``<moe>.experts.w13_*`` / ``w2_*`` (see ``_fused_experts``), as Megatron-Bridge 0.6's
  ``export_hf_weights_modelopt`` writes them. For a consumer that copies into those parameters by
  name. vLLM's model ``load_weights`` skips these names without an error (0.24, 0.29, 0.33: no
  entry of the model's expert mapping matches them), so the experts keep what they held; patchkit's
  ``refit_weights`` refuses them. :func:`split_fused_experts` turns such a stream into the
  ``per_expert`` one, byte for byte (docs/qat-export.md, "MoE expert names").

The bytes are the same in both: NVFP4 blocks run along the input dimension, so every row of a
fused tensor is the same row of its expert's tensor (``tests/export`` checks it).
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Literal

import torch

from .._errors import QATExportError

ExpertLayout = Literal["per_expert", "fused"]
EXPERT_LAYOUTS: tuple[str, ...] = ("per_expert", "fused")

_FUSED = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<group>w13|w2)_"
                    r"(?P<kind>weight|weight_scale|weight_scale_2|input_scale)$")


def check_expert_layout(layout: object) -> ExpertLayout:
    """``layout`` if it is one of :data:`EXPERT_LAYOUTS`; :class:`QATExportError` otherwise."""
    if layout == "per_expert":
        return "per_expert"
    if layout == "fused":
        return "fused"
    raise QATExportError(
        f"unknown expert_layout {layout!r}",
        hint=f"use one of {', '.join(repr(name) for name in EXPERT_LAYOUTS)} (per_expert: Hugging Face / ModelOpt "
             "names, what vLLM's load_weights takes; fused: vLLM FusedMoE parameter names)",
    )


def _per_expert_parts(group: str, kind: str, tensor: torch.Tensor) -> Iterator[tuple[int, str, torch.Tensor]]:
    """``(expert, projection, tensor)`` for one fused tensor."""
    for expert in range(tensor.shape[0]):
        if group == "w2":
            yield expert, "down_proj", tensor[expert]
        elif kind in ("weight", "weight_scale"):  # [E, 2I, ...]: each expert's gate rows, then its up rows
            rows = tensor.shape[1] // 2
            yield expert, "gate_proj", tensor[expert, :rows]
            yield expert, "up_proj", tensor[expert, rows:]
        elif tensor.dim() == 2:  # [E, 2] global / input scales: gate's, then up's
            yield expert, "gate_proj", tensor[expert, 0]
            yield expert, "up_proj", tensor[expert, 1]
        else:  # [E]: one scale for gate and up
            yield expert, "gate_proj", tensor[expert]
            yield expert, "up_proj", tensor[expert]


def split_fused_experts(stream: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream with every fused expert tensor (``experts.w13_*``/``w2_*``) split into per-expert names.

    What a fused stream (``expert_layout="fused"``, or Megatron-Bridge 0.6's own
    ``export_hf_weights_modelopt``) needs before vLLM's ``model.load_weights`` or ``refit_weights``,
    which take per-expert names only. Lazy: one fused tensor at a time; the parts are views of it.
    """
    for name, tensor in stream:
        match = _FUSED.match(name)
        if match is None:
            yield name, tensor
            continue
        for expert, projection, part in _per_expert_parts(match["group"], match["kind"], tensor):
            yield f"{match['prefix']}.{expert}.{projection}.{match['kind']}", part
