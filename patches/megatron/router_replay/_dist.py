"""Moving recorded indices between ranks: sequence-parallel shards and pipeline stages.

- Sequence parallelism: a router on TP rank ``r`` sees rows ``[r * n/tp, (r + 1) * n/tp)`` of the
  packed tokens. :func:`gather_sequence_parallel` all-gathers them (rank order) into the full rows;
  :func:`sequence_parallel_slice` cuts full rows back to this rank's shard.
- Pipeline (and virtual pipeline): each stage holds the routers of its own layers.
  :func:`gather_pipeline` all-gathers every stage's ``{layer: indices}`` over the pipeline group and
  merges them in global layer order. Layers are identified by their global number, so virtual
  pipeline chunks (stage 0 holding layers 1-2 and 5-6, say) need no schedule-table reordering:
  sorting by number is the global order. Replaying, every stage takes its own layers from the
  merged mapping (``for_model(chunks).set_targets(merged)``).

Tensors travel as bytes (``uint8`` views), so any index dtype works with NCCL, which has no int16;
layer keys travel with ``all_gather_object`` (small). Every stage's tensors must have the same token
count (one micro-batch) and dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import torch

from .._errors import RouterReplayError
from ._layers import LayerKey, merge_layers


def _tp_group() -> Any:
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_group()


def gather_sequence_parallel(shard: torch.Tensor, group: Any = None) -> torch.Tensor:
    """This TP rank's ``[rows/tp, ...]`` shard to the full ``[rows, ...]`` (all ranks' shards in order)."""
    group = group if group is not None else _tp_group()
    world = torch.distributed.get_world_size(group)
    if world == 1:
        return shard
    payload = shard.contiguous()
    parts = [torch.empty_like(payload) for _ in range(world)]
    torch.distributed.all_gather(parts, payload, group=group)
    return torch.cat(parts)


def sequence_parallel_slice(full: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Full ``[rows, ...]`` to this TP rank's shard; rows must split evenly."""
    group = group if group is not None else _tp_group()
    world = torch.distributed.get_world_size(group)
    rank = torch.distributed.get_rank(group)
    if full.shape[0] % world:
        raise RouterReplayError(
            f"{full.shape[0]} rows do not split over tensor-parallel size {world}: pack with the "
            "model input's layout (it pads to a multiple of tp)"
        )
    rows = full.shape[0] // world
    return full[rank * rows : (rank + 1) * rows]


def gather_pipeline(
    local: Mapping[LayerKey, torch.Tensor], group: Any = None
) -> dict[LayerKey, torch.Tensor]:
    """Every pipeline stage's ``{layer: [tokens, topk]}``, merged in global layer order, on every stage."""
    if group is None:
        from megatron.core import parallel_state

        group = parallel_state.get_pipeline_model_parallel_group()
    world = torch.distributed.get_world_size(group)
    keys = list(local)
    if not keys:
        raise RouterReplayError("this stage has no recorded layers to gather")
    first = local[keys[0]]
    stacked = torch.stack([local[key] for key in keys]).contiguous()  # [L, tokens, topk]
    meta = (keys, tuple(first.shape), str(first.dtype))
    metas: list[Optional[tuple[Any, ...]]] = [None] * world
    torch.distributed.all_gather_object(metas, meta, group=group)
    shapes = {(m[1], m[2]) for m in metas if m is not None}
    if len(shapes) != 1:
        raise RouterReplayError(
            f"pipeline stages recorded different shapes/dtypes {sorted(shapes)}: gather one micro-batch at a time"
        )
    most = max(len(m[0]) for m in metas if m is not None)
    payload = torch.zeros((most, *stacked.shape[1:]), dtype=stacked.dtype, device=stacked.device)
    payload[: len(keys)] = stacked
    as_bytes = payload.view(torch.uint8) if payload.dim() and payload.element_size() > 1 else payload
    parts = [torch.empty_like(as_bytes) for _ in range(world)]
    torch.distributed.all_gather(parts, as_bytes, group=group)
    merged = []
    for part, m in zip(parts, metas, strict=True):
        assert m is not None
        values = part.view(stacked.dtype) if part.dtype != stacked.dtype else part
        merged.append(dict(zip(m[0], values[: len(m[0])], strict=True)))
    return merge_layers(merged)
