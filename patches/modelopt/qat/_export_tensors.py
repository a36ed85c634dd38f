"""The checkpoint tensors of one exported parameter (torch only: no ModelOpt, no Megatron).

What a quantized linear becomes in ModelOpt's NVFP4 checkpoint format, whichever export path
produced the high-precision tensor: ``<m>.weight`` (packed E2M1), ``<m>.weight_scale`` (FP8 per
block), ``<m>.weight_scale_2`` (float32) and ``<m>.input_scale`` when the input is quantized.
Kept apart from ``._export`` (which imports ModelOpt) so a consumer-side test, a vLLM process
say, can produce the same tensors from the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from ._export_finite import NonFiniteWeights
from ._nvfp4_pack import quantize_nvfp4
from ._nvfp4_pack import weight_scale_2 as _scale_2


@dataclass(frozen=True)
class QuantSpec:
    """What the export needs from one quantized linear: block size and the calibrated amaxes."""

    block_size: int
    amax: torch.Tensor
    input_amax: torch.Tensor | None = None

    def merged(self, other: "QuantSpec") -> "QuantSpec":
        """Tensor-parallel shards of one linear: the whole weight's amax is the largest shard amax."""
        input_amax = self.input_amax
        if other.input_amax is not None:
            input_amax = other.input_amax if input_amax is None else torch.maximum(input_amax, other.input_amax)
        return QuantSpec(self.block_size, torch.maximum(self.amax, other.amax), input_amax)


def checkpoint_tensors(
    name: str, tensor: torch.Tensor, spec: QuantSpec | None, nonfinite: NonFiniteWeights
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint tensors of one exported parameter: as is, or NVFP4 ``weight``, scales, input scale.

    A quantized weight's NaN/infinity flag is recorded in ``nonfinite`` (read at the end of the stream).
    """
    if spec is None:
        yield name, tensor
        return
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    flags: list[torch.Tensor] = []
    packed, scale, scale_2 = quantize_nvfp4(tensor, spec.amax.to(tensor.device), spec.block_size, nonfinite=flags)
    nonfinite.record(name, flags[0])
    yield name, packed
    yield f"{base}.weight_scale", scale
    yield f"{base}.weight_scale_2", scale_2
    if spec.input_amax is not None:
        yield f"{base}.input_scale", _scale_2(spec.input_amax).to(tensor.device)
