"""The checkpoint tensors of one exported parameter (torch only: no ModelOpt, no Megatron).

What a quantized linear becomes in ModelOpt's NVFP4 checkpoint format, whichever export path
produced the high-precision tensor: ``<m>.weight`` (packed E2M1), ``<m>.weight_scale`` (FP8 per
block), ``<m>.weight_scale_2`` (float32) and ``<m>.input_scale`` when the input is quantized.
Kept apart from ``._export`` (which imports ModelOpt) so a consumer-side test, a vLLM process
say, can produce the same tensors from the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import torch

from ._export_finite import NonFiniteWeights
from ._nvfp4_pack import quantize_nvfp4, quantize_nvfp4_group
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
    flags: list[torch.Tensor] = []
    packed, scale, scale_2 = quantize_nvfp4(tensor, spec.amax.to(tensor.device), spec.block_size, nonfinite=flags)
    nonfinite.record(name, flags[0])
    yield from _quantized(name, tensor.device, spec, packed, scale, scale_2)


def _quantized(
    name: str, device: torch.device, spec: QuantSpec, packed: torch.Tensor, scale: torch.Tensor, scale_2: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    base = name[: -len(".weight")] if name.endswith(".weight") else name
    yield name, packed
    yield f"{base}.weight_scale", scale
    yield f"{base}.weight_scale_2", scale_2
    if spec.input_amax is not None:
        yield f"{base}.input_scale", _scale_2(spec.input_amax).to(device)


def specs_on_device(specs: dict[str, QuantSpec], device: torch.device) -> dict[str, QuantSpec]:
    """The same specs with their amaxes on ``device``, moved in one copy.

    Each weight's ``weight_scale_2`` is computed on its device from the amax; moving the amaxes one
    by one from (pageable) host memory would make the host wait, before each weight's kernel, for
    the previous one to finish. ``input_amax`` stays where it is (it becomes a host-side scale).
    """
    if device.type == "cpu" or not specs:
        return dict(specs)
    names = list(specs)
    moved = torch.stack([specs[name].amax.detach().reshape(()).float() for name in names]).to(device)
    return {name: QuantSpec(specs[name].block_size, amax, specs[name].input_amax)
            for name, amax in zip(names, moved.unbind(), strict=True)}


#: Weights from this size (bytes) are quantized one launch each: a grouped launch finds each program's
#: weight through two dependent reads before its first load, which costs large weights about a third
#: of their throughput on an H200, while their own launch costs the host little against their kernel.
GROUPED_WEIGHT_LIMIT = 64 << 20

#: One exported parameter: name, high-precision tensor, its quantization (None: exported as is), and
#: whether holding it costs memory of its own (a gathered or received copy, not the model's parameter).
StreamItem = tuple[str, torch.Tensor, "QuantSpec | None", bool]


def checkpoint_stream(items: Iterable[StreamItem], nonfinite: NonFiniteWeights) -> Iterator[tuple[str, torch.Tensor]]:
    """:func:`checkpoint_tensors` of every item, in order, with consecutive quantized CUDA weights under
    :data:`GROUPED_WEIGHT_LIMIT` grouped into one kernel launch (``_nvfp4_pack.quantize_nvfp4_group``):
    same names, same bits.

    A group's extra memory, its packed outputs plus the inputs it holds that are not the model's own
    parameters, stays within the largest tensor the stream has seen, so the peak stays under twice
    that with the next tensor being produced. The grouping depends only on the items' shapes, dtypes,
    devices and ``held`` flags, so ranks that see the same items group them alike.
    """
    group: list[tuple[str, torch.Tensor, QuantSpec]] = []
    group_bytes = 0
    largest = 0
    for name, tensor, spec, held in items:
        size = tensor.numel() * tensor.element_size()
        largest = max(largest, size)
        on_device = spec is not None and spec.block_size == 16 and tensor.is_cuda
        groupable = on_device and size < GROUPED_WEIGHT_LIMIT
        if group and (not groupable or tensor.device != group[0][1].device or tensor.dtype != group[0][1].dtype):
            yield from _flush(group, nonfinite)
            group, group_bytes = [], 0
        if not groupable:
            yield from checkpoint_tensors(name, tensor, spec, nonfinite)
            continue
        assert spec is not None
        extra = tensor.numel() * 9 // 16 + (size if held else 0)  # 0.5 + 1/16 bytes a weight written
        if group and group_bytes + extra > largest:
            yield from _flush(group, nonfinite)
            group, group_bytes = [], 0
        group.append((name, tensor, spec))
        group_bytes += extra
    if group:
        yield from _flush(group, nonfinite)


def _flush(
    group: list[tuple[str, torch.Tensor, QuantSpec]], nonfinite: NonFiniteWeights
) -> Iterator[tuple[str, torch.Tensor]]:
    results, flags = quantize_nvfp4_group([t for _, t, _ in group], [s.amax for _, _, s in group], 16)
    nonfinite.record_group([name for name, _, _ in group], flags)
    for (name, tensor, spec), (packed, scale, scale_2) in zip(group, results, strict=True):
        yield from _quantized(name, tensor.device, spec, packed, scale, scale_2)
