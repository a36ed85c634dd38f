"""Per-expert Hugging Face MoE tensors fused into vLLM's FusedMoE checkpoint names, as Bridge 0.6 exports them.

Megatron-Bridge 0.6's ``export_hf_weights_modelopt`` does not write quantized experts under their
per-expert Hugging Face names (``mlp.experts.3.gate_proj.weight``): it stacks one layer's experts
into the tensors vLLM's ``FusedMoE`` holds, ``mlp.experts.w13_weight`` (``[E, 2I, H/2]``, each
expert's gate rows then up rows) and ``mlp.experts.w2_weight`` (``[E, H, I/2]``), with
``w13_weight_scale_2`` of shape ``[E, 2]`` and ``w2_weight_scale_2`` of shape ``[E]``
(``modelopt_utils._FUSED_MOE_NVFP4_NAME_MAP``, ``_format_nvfp4_weight_scale_2_for_export``). patchkit's
own path writes the same, so a consumer sees one format whichever path ran.

Only quantized ``gate_proj``/``up_proj``/``down_proj`` experts are fused (Bridge fuses names whose
projections share a suffix; ``w1``/``w3`` do not); unquantized experts pass through unchanged.
Quantizing the stacked tensor expert by expert gives the same bytes as quantizing the stack,
because every row uses only its own expert's scale.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator

import torch

from ._nvfp4_pack import quantize_nvfp4
from ._nvfp4_pack import weight_scale_2 as _scale_2

_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_GROUP = {"gate_proj": "w13", "up_proj": "w13", "down_proj": "w2"}

#: ``(name, tensor, spec)`` in, where spec is a ``QuantSpec`` or None.
Stream = Iterable[tuple[str, torch.Tensor, object]]


def _fused(prefix: str, group: str, experts: dict[int, dict[str, tuple[torch.Tensor, object]]], count: int):
    packed, scales, scales_2, inputs = [], [], [], []
    for expert in range(count):
        parts = experts[expert]
        names = ("gate_proj", "up_proj") if group == "w13" else ("down_proj",)
        weight = torch.cat([parts[n][0] for n in names], dim=0) if len(names) > 1 else parts[names[0]][0]
        spec = parts[names[0]][1]
        p, s, s2 = quantize_nvfp4(weight, spec.amax.to(weight.device), spec.block_size)  # type: ignore[attr-defined]
        packed.append(p)
        scales.append(s)
        scales_2.append(s2.reshape(()))
        if spec.input_amax is not None:  # type: ignore[attr-defined]
            inputs.append(_scale_2(spec.input_amax).reshape(()).to(weight.device))  # type: ignore[attr-defined]
    scale_2 = torch.stack(scales_2)
    yield f"{prefix}.{group}_weight", torch.stack(packed)
    yield f"{prefix}.{group}_weight_scale", torch.stack(scales)
    yield f"{prefix}.{group}_weight_scale_2", scale_2[:, None].expand(-1, 2).contiguous() if group == "w13" else scale_2
    if inputs:
        input_scale = torch.stack(inputs)
        yield f"{prefix}.{group}_input_scale", input_scale[:, None].expand(-1, 2).contiguous() if group == "w13" \
            else input_scale


def fuse_experts(
    stream: Stream, num_experts: int, emit: Callable[[str, torch.Tensor, object], Iterator[tuple[str, torch.Tensor]]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """Pass every tensor to ``emit``, except quantized experts, which come out fused per layer."""
    pending: dict[tuple[str, str], dict[int, dict[str, tuple[torch.Tensor, object]]]] = {}
    for name, tensor, spec in stream:
        match = _EXPERT.match(name)
        if match is None or spec is None or num_experts <= 0:
            yield from emit(name, tensor, spec)
            continue
        key = (match["prefix"], _GROUP[match["proj"]])
        experts = pending.setdefault(key, {})
        experts.setdefault(int(match["expert"]), {})[match["proj"]] = (tensor, spec)
        needed = 2 if key[1] == "w13" else 1
        if len(experts) == num_experts and all(len(parts) == needed for parts in experts.values()):
            del pending[key]
            yield from _fused(key[0], key[1], experts, num_experts)
    if pending:
        missing = ", ".join(f"{prefix}.{group} ({len(experts)} of {num_experts} experts)"
                            for (prefix, group), experts in pending.items())
        raise RuntimeError(f"the export stream ended with incomplete expert groups: {missing}")
