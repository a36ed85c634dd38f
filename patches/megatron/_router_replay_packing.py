"""Per-sample index tensors to and from the packed THD order an MoE router sees, vectorised.

RL frameworks feed Megatron packed ("THD") sequences: the valid tokens of every sample laid end to
end, each sample padded so its length is a multiple of an alignment, and, under context
parallelism (CP), each padded sample cut into ``2 * cp`` equal chunks of which CP rank ``r`` holds
chunk ``r`` and chunk ``2 * cp - 1 - r`` (the load-balanced causal split of TransformerEngine).
A router's top-k indices are rows in that order, so replay targets must be packed with exactly the
padding the model input was packed with, or every token after the first difference replays
another token's experts.

The padding rule (the one verl's ``preprocess_packed_seqs`` applies, including its
``use_fp8_padding`` fix for router replay):

- ``align = tp`` without CP, ``tp * cp * 2`` with CP;
- without FP8, each sample is padded to a multiple of ``align``;
- with FP8 (``config.fp8`` in ``"e4m3"``, ``"hybrid"``), each sample is padded to a multiple of
  ``lcm(16, align)``, and the last sample is padded further so the total is a multiple of
  ``align * 128``.

Everything is computed with tensor operations over the whole batch, no Python loop over samples.
Building a layout costs one device-to-host copy (the padded total and the tokens per CP rank, which
size the outputs); :func:`pack` and :func:`unpack` then sync nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from patchkit.runtime.probing import get_field

__all__ = [
    "FP8_PADDED_FORMATS", "ThdLayout", "pack", "sequence_parallel_shard", "thd_layout", "unpack", "uses_fp8_padding",
]

FP8_PADDED_FORMATS = ("e4m3", "hybrid")
"""``TransformerConfig.fp8`` values under which packed sequences get FP8 padding."""

_FP8_SEQUENCE_MULTIPLE = 16
_FP8_TOTAL_MULTIPLE = 128

Fill = Union[int, str]


@dataclass(frozen=True)
class ThdLayout:
    """Where each valid token of a ``[batch, seq]`` grid lands in the packed THD order.

    Slots are numbered over all CP ranks, rank-major: rank ``r`` holds slots
    ``[r * local_tokens, (r + 1) * local_tokens)``.
    """

    batch_size: int
    seq_len: int
    tp_size: int
    cp_size: int
    fp8_padding: bool
    align: int
    """Alignment from parallelism alone: ``tp``, or ``tp * cp * 2`` with CP."""
    sequence_align: int
    """What each sample is padded to a multiple of: ``align``, or ``lcm(16, align)`` under FP8."""
    lengths: torch.Tensor
    """[batch] valid tokens per sample."""
    cu_seqlens: torch.Tensor
    """[batch + 1] offsets of the unpadded samples (``PackedSeqParams.cu_seqlens_q``'s input)."""
    cu_seqlens_padded: torch.Tensor
    """[batch + 1] offsets of the padded samples (``PackedSeqParams.cu_seqlens_q_padded``)."""
    total_tokens: int
    """Padded tokens over all CP ranks."""
    tokens_per_rank: tuple[int, ...]
    """Valid (non-padding) tokens each CP rank holds."""
    slot_of_cell: torch.Tensor
    """[batch * seq] the slot of each grid cell's token, 0 for cells that hold none."""
    invalid_cells: torch.Tensor
    """Flat indices of the grid cells that hold no token."""
    cell_of_slot: torch.Tensor
    """[total_tokens] the grid cell each slot's token comes from, 0 for padding slots."""
    padding_slots: tuple[torch.Tensor, ...]
    """Per CP rank, the local slots that are padding."""

    @property
    def local_tokens(self) -> int:
        """Tokens one CP rank's model input holds (what a router sees without sequence parallel)."""
        return self.total_tokens // self.cp_size

    @property
    def max_seqlen(self) -> torch.Tensor:
        """The longest padded sample (``PackedSeqParams.max_seqlen_q``)."""
        return (self.cu_seqlens_padded[1:] - self.cu_seqlens_padded[:-1]).max()


def uses_fp8_padding(config: Any) -> bool:
    """Whether ``config`` (any stack's, or None) asks for FP8 THD padding; missing means no."""
    return get_field(config, "fp8", None) in FP8_PADDED_FORMATS


def _as_mask(
    valid: Union[torch.Tensor, Sequence[int]], seq_len: Optional[int], device: Optional[torch.device]
) -> torch.Tensor:
    """A [batch, seq] bool mask from an attention mask, or from per-sample lengths (left-aligned)."""
    if isinstance(valid, torch.Tensor) and valid.dim() == 2:
        if seq_len is not None and seq_len != valid.shape[1]:
            raise ValueError(f"seq_len={seq_len} but the attention mask has {valid.shape[1]} columns")
        return valid.to(device=device or valid.device, dtype=torch.bool)
    lengths = torch.as_tensor(valid, dtype=torch.long, device=device)
    if lengths.dim() != 1:
        raise ValueError(
            "expected a [batch, seq] attention mask or a 1-D sequence of per-sample lengths; got "
            f"shape {list(lengths.shape)}"
        )
    if seq_len is None:
        raise ValueError("per-sample lengths need seq_len, the width of the [batch, seq] tensors")
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1)


def thd_layout(
    valid: Union[torch.Tensor, Sequence[int]],
    *,
    seq_len: Optional[int] = None,
    config: Any = None,
    tp_size: Optional[int] = None,
    cp_size: Optional[int] = None,
    fp8_padding: Optional[bool] = None,
    device: Optional[torch.device] = None,
) -> ThdLayout:
    """The packed layout of a batch, with the padding the model input was built with.

    Args:
        valid: a ``[batch, seq]`` attention mask (True/1 = token; any positions), or per-sample
            lengths (tokens at the start of each row).
        seq_len: width of the per-sample tensors; required with lengths.
        config: a ``TransformerConfig`` or any object; ``fp8``, ``tensor_model_parallel_size`` and
            ``context_parallel_size`` are probed on it (absent means no FP8, size 1).
        tp_size, cp_size, fp8_padding: override what ``config`` says.
    """
    tp = int(tp_size if tp_size is not None else get_field(config, "tensor_model_parallel_size", 1))
    cp = int(cp_size if cp_size is not None else get_field(config, "context_parallel_size", 1))
    if tp < 1 or cp < 1:
        raise ValueError(f"tp_size and cp_size must be >= 1; got tp_size={tp}, cp_size={cp}")
    fp8 = uses_fp8_padding(config) if fp8_padding is None else bool(fp8_padding)
    align = tp * cp * 2 if cp > 1 else tp
    sequence_align = math.lcm(_FP8_SEQUENCE_MULTIPLE, align) if fp8 else align

    mask = _as_mask(valid, seq_len, device)
    batch, width = mask.shape
    dev = mask.device
    mask_long = mask.long()
    lengths = mask_long.sum(dim=1)
    padded = (lengths + sequence_align - 1) // sequence_align * sequence_align
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    if fp8 and batch > 0:
        total_multiple = align * _FP8_TOTAL_MULTIPLE
        extra = (total_multiple - padded.sum() % total_multiple) % total_multiple
        padded[-1] += extra  # the last sample absorbs it, as the model input's packing does
    cu_seqlens = torch.cat([zero, lengths.cumsum(0)])
    cu_padded = torch.cat([zero, padded.cumsum(0)])

    # Offset of each token within its sample (meaningless, and masked out, where there is none).
    offset = mask_long.cumsum(dim=1) - 1
    start = cu_padded[:-1].unsqueeze(1)
    if cp == 1:
        owner = torch.zeros_like(offset)
        local_slot = start + offset
    else:
        chunk = (padded // (2 * cp)).clamp(min=1).unsqueeze(1)
        index = offset.clamp(min=0) // chunk
        front = index < cp
        owner = torch.where(front, index, 2 * cp - 1 - index)
        within = offset - index * chunk
        local_slot = start // cp + torch.where(front, within, chunk + within)

    # The one host sync: output sizes. Everything after uses tensors sized by these numbers.
    # Tokens per CP rank; scatter_add, not bincount, which syncs on CUDA to size its output.
    counts = torch.zeros(cp, dtype=torch.long, device=dev).scatter_add_(
        0, owner.clamp(0, cp - 1).flatten(), mask_long.flatten()
    )
    host = torch.cat([cu_padded[-1:], counts]).tolist()
    total, tokens_per_rank = int(host[0]), tuple(int(n) for n in host[1:])
    local = total // cp

    flat_mask = mask.flatten()
    global_slot = (owner * local + local_slot).flatten()
    num_valid = sum(tokens_per_rank)
    valid_cells = torch.nonzero_static(flat_mask, size=num_valid).squeeze(1)
    invalid_cells = torch.nonzero_static(~flat_mask, size=batch * width - num_valid).squeeze(1)
    slot_of_cell = torch.where(flat_mask, global_slot, torch.zeros_like(global_slot))

    is_token = torch.zeros(total, dtype=torch.bool, device=dev)
    is_token.index_fill_(0, global_slot[valid_cells], True)  # not `[...] = True`: that syncs on CUDA
    cell_of_slot = torch.zeros(total, dtype=torch.long, device=dev)
    cell_of_slot[global_slot[valid_cells]] = valid_cells
    padding_slots = tuple(
        torch.nonzero_static(~is_token[r * local : (r + 1) * local], size=local - tokens_per_rank[r])
        .squeeze(1)
        for r in range(cp)  # CP ranks, not samples: a handful of iterations
    )
    return ThdLayout(
        batch_size=batch, seq_len=width, tp_size=tp, cp_size=cp, fp8_padding=fp8, align=align,
        sequence_align=sequence_align, lengths=lengths, cu_seqlens=cu_seqlens,
        cu_seqlens_padded=cu_padded, total_tokens=total, tokens_per_rank=tokens_per_rank,
        slot_of_cell=slot_of_cell, invalid_cells=invalid_cells, cell_of_slot=cell_of_slot,
        padding_slots=padding_slots,
    )


def _fill_row(fill: Fill, trailing: torch.Size, like: torch.Tensor) -> torch.Tensor:
    """The value padding slots get, broadcastable to one token's ``trailing`` shape."""
    if fill == "distinct":
        if len(trailing) == 0:
            return torch.zeros((), dtype=like.dtype, device=like.device)
        # A padding token replayed as [0, 0, ...] would pick one expert topk times, which shrinks
        # the routing map below tokens * topk; distinct experts keep every count exact.
        return torch.arange(trailing[-1], device=like.device).to(like.dtype).expand(trailing)
    if isinstance(fill, str):
        raise ValueError(f"fill must be an int or 'distinct'; got {fill!r}")
    return torch.full(trailing, fill, dtype=like.dtype, device=like.device)


def pack(
    per_sample: torch.Tensor,
    layout: ThdLayout,
    *,
    cp_rank: Optional[int] = None,
    fill: Fill = "distinct",
) -> torch.Tensor:
    """``[batch, seq, *rest]`` to the packed order: ``[local_tokens, *rest]`` of ``cp_rank``.

    With ``cp_rank=None`` and CP > 1, returns every rank's tensor: ``[cp, local_tokens, *rest]``.
    Padding slots get ``fill``: by default ``0, 1, ..., k-1`` along the last dimension (distinct
    experts for a ``[..., topk]`` index tensor), else the given integer.
    """
    _check_grid(per_sample, layout)
    trailing = per_sample.shape[2:]
    rows = per_sample.reshape(layout.batch_size * layout.seq_len, *trailing)
    fill_row = _fill_row(fill, trailing, per_sample)
    local = layout.local_tokens
    ranks = range(layout.cp_size) if cp_rank is None else (_check_rank(cp_rank, layout),)
    packed = []
    for rank in ranks:  # CP ranks, not samples
        out = rows.index_select(0, layout.cell_of_slot[rank * local : (rank + 1) * local])
        out[layout.padding_slots[rank]] = fill_row
        packed.append(out)
    if cp_rank is not None or layout.cp_size == 1:
        return packed[0]
    return torch.stack(packed)


def unpack(
    packed: Union[torch.Tensor, Sequence[torch.Tensor]],
    layout: ThdLayout,
    *,
    fill: int = 0,
) -> torch.Tensor:
    """Packed ``[tokens, *rest]`` back to ``[batch, seq, *rest]``; cells without a token get ``fill``.

    Under CP, pass every rank's tensor (gathered by the caller): ``[cp, local_tokens, *rest]`` or a
    list of ``cp`` tensors in rank order. Under sequence parallelism, gather the TP shards first.
    """
    rows = _all_slots(packed, layout)
    out = rows.index_select(0, layout.slot_of_cell)
    _fill_rows(out.view(out.shape[0], -1), layout.invalid_cells, fill)
    return out.view(layout.batch_size, layout.seq_len, *rows.shape[1:])


def _fill_rows(rows: torch.Tensor, index: torch.Tensor, value: int) -> None:
    """``rows[index] = value`` for a contiguous 2-D tensor.

    ``index_fill_`` works element by element; zeroing whole rows of narrow dtypes (uint8 expert
    indices: 384 bytes per token for 48 layers x top-8) is ~7x faster on the same bytes viewed as
    int64, which zero-fill leaves bit-identical.
    """
    row_bytes = rows.shape[1] * rows.element_size()
    if value == 0 and rows.shape[1] > 0 and row_bytes % 8 == 0 and rows.data_ptr() % 8 == 0:
        rows = rows.view(torch.uint8).view(torch.int64)
    rows.index_fill_(0, index, value)


def sequence_parallel_shard(packed: torch.Tensor, layout: ThdLayout, tp_rank: int) -> torch.Tensor:
    """The rows a router on ``tp_rank`` sees under sequence parallelism (a contiguous slice)."""
    if not 0 <= tp_rank < layout.tp_size:
        raise ValueError(f"tp_rank {tp_rank} is outside tensor-parallel size {layout.tp_size}")
    per_rank = packed.shape[0] // layout.tp_size
    return packed[tp_rank * per_rank : (tp_rank + 1) * per_rank]


def _check_grid(per_sample: torch.Tensor, layout: ThdLayout) -> None:
    if per_sample.dim() < 2 or tuple(per_sample.shape[:2]) != (layout.batch_size, layout.seq_len):
        raise ValueError(
            f"expected a [batch={layout.batch_size}, seq={layout.seq_len}, ...] tensor for this "
            f"layout; got shape {list(per_sample.shape)}"
        )


def _check_rank(cp_rank: int, layout: ThdLayout) -> int:
    if not 0 <= cp_rank < layout.cp_size:
        raise ValueError(f"cp_rank {cp_rank} is outside context-parallel size {layout.cp_size}")
    return cp_rank


def _all_slots(packed: Union[torch.Tensor, Sequence[torch.Tensor]], layout: ThdLayout) -> torch.Tensor:
    """Every CP rank's packed rows, rank-major, as one [total_tokens, *rest] tensor."""
    if not isinstance(packed, torch.Tensor):
        packed = torch.cat(list(packed))
    elif layout.cp_size > 1 and packed.dim() >= 2 and packed.shape[0] == layout.cp_size and (
        packed.shape[1] == layout.local_tokens
    ):
        packed = packed.flatten(0, 1)
    if packed.shape[0] != layout.total_tokens:
        raise ValueError(
            f"expected {layout.total_tokens} packed tokens over {layout.cp_size} CP rank(s) "
            f"({layout.local_tokens} per rank); got shape {list(packed.shape)}"
        )
    return packed
