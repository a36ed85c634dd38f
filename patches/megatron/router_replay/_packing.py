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

from .._errors import PackedShapeError

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
    slot_of_token: torch.Tensor
    """[valid tokens] the slot of each token, tokens in sample-major order (a jagged tensor's values)."""
    num_experts: Optional[int] = None
    """Experts per MoE layer (``num_moe_experts`` of the config), used to spread padding rows."""

    @property
    def local_tokens(self) -> int:
        """Tokens one CP rank's model input holds (what a router sees without sequence parallel)."""
        return self.total_tokens // self.cp_size

    def padding_mask(self, cp_rank: Optional[int] = None) -> torch.Tensor:
        """[local_tokens] bool, True on padding slots of ``cp_rank`` (``[cp, local]`` for all ranks).

        megatron-core 0.16+ takes it as ``GPTModel.forward(..., padding_mask=mask.unsqueeze(0))``
        for a THD input given as one row, and then leaves padding tokens out of the aux loss, the
        z-loss and the expert-bias token counts (0.14/0.15 have no such argument).
        """
        local = self.local_tokens
        masks = []
        ranks = range(self.cp_size) if cp_rank is None else (_check_rank(cp_rank, self),)
        for rank in ranks:
            mask = torch.zeros(local, dtype=torch.bool, device=self.lengths.device)
            mask.index_fill_(0, self.padding_slots[rank], True)
            masks.append(mask)
        return masks[0] if cp_rank is not None or self.cp_size == 1 else torch.stack(masks)

    @property
    def max_seqlen(self) -> torch.Tensor:
        """The longest padded sample (``PackedSeqParams.max_seqlen_q``)."""
        return (self.cu_seqlens_padded[1:] - self.cu_seqlens_padded[:-1]).max()


def uses_fp8_padding(config: Any) -> bool:
    """Whether ``config`` (any stack's, or None) asks for FP8 THD padding; missing means no."""
    return get_field(config, "fp8", None) in FP8_PADDED_FORMATS


def _as_mask(
    valid: Union[torch.Tensor, Sequence[int]], seq_len: Optional[int], device: Optional[torch.device]
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """A [batch, seq] bool mask from an attention mask, per-sample lengths (left-aligned), or a
    jagged nested tensor (verl's ``input_ids``: its offsets give the lengths).

    Also returns the lengths where the input gave them (checked against ``seq_len`` by the caller
    after its one host sync), else None.
    """
    if isinstance(valid, torch.Tensor) and valid.is_nested:
        lengths = _nested_lengths(valid).to(device or valid.device)
        if seq_len is None:
            seq_len = int(lengths.max()) if lengths.numel() else 0
        return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1), lengths
    if isinstance(valid, torch.Tensor) and valid.dim() == 2:
        if seq_len is not None and seq_len != valid.shape[1]:
            raise ValueError(f"seq_len={seq_len} but the attention mask has {valid.shape[1]} columns")
        return valid.to(device=device or valid.device, dtype=torch.bool), None
    lengths = torch.as_tensor(valid, dtype=torch.long, device=device)
    if lengths.dim() != 1:
        raise ValueError(
            "expected a [batch, seq] attention mask, a jagged nested tensor or a 1-D sequence of "
            f"per-sample lengths; got shape {list(lengths.shape)}"
        )
    if seq_len is None:
        raise ValueError("per-sample lengths need seq_len, the width of the [batch, seq] tensors")
    if seq_len < 0:
        raise ValueError(f"seq_len must be >= 0; got {seq_len}")
    return torch.arange(seq_len, device=lengths.device) < lengths.unsqueeze(1), lengths


def _check_lengths(lengths: torch.Tensor, low: int, high: int, seq_len: int) -> None:
    """Lengths must fit the grid: one past ``seq_len`` or below 0 cannot be packed faithfully."""
    if low < 0 or high > seq_len:
        bad = torch.nonzero((lengths < 0) | (lengths > seq_len)).flatten()[:8]
        raise ValueError(
            f"per-sample lengths must lie in [0, seq_len={seq_len}]; samples {bad.tolist()} have "
            f"{lengths[bad].tolist()} (a length outside the grid would drop or invent tokens)"
        )


def _nested_lengths(nested: torch.Tensor) -> torch.Tensor:
    """Per-sample lengths of a jagged nested tensor ([batch, j, ...])."""
    if nested.layout != torch.jagged:
        raise ValueError("nested tensors must use layout=torch.jagged (what verl passes)")
    return nested.offsets().diff().long()


def thd_layout(
    valid: Union[torch.Tensor, Sequence[int]],
    *,
    seq_len: Optional[int] = None,
    config: Any = None,
    tp_size: Optional[int] = None,
    cp_size: Optional[int] = None,
    fp8_padding: Optional[bool] = None,
    num_experts: Optional[int] = None,
    device: Optional[torch.device] = None,
) -> ThdLayout:
    """The packed layout of a batch, with the padding the model input was built with.

    Args:
        valid: a ``[batch, seq]`` attention mask (True/1 = token; any positions), per-sample
            lengths (tokens at the start of each row; each in ``[0, seq_len]``, else ValueError),
            or a jagged nested tensor such as verl's ``input_ids`` (lengths from its offsets).
        seq_len: width of the per-sample tensors; required with lengths; for a nested tensor,
            defaults to its longest sample.
        num_experts: experts per MoE layer (probed as ``num_moe_experts``); lets :func:`pack`
            spread padding rows over all experts.

    An empty batch, or one whose samples all have length 0, gives a layout of 0 tokens:
    :func:`pack` returns ``[0, *rest]`` and :func:`unpack` a grid filled with ``fill``.
        config: a ``TransformerConfig`` or any object; ``fp8``, ``tensor_model_parallel_size`` and
            ``context_parallel_size`` are probed on it (absent means no FP8, size 1).
        tp_size, cp_size, fp8_padding: override what ``config`` says.
    """
    tp = int(tp_size if tp_size is not None else get_field(config, "tensor_model_parallel_size", 1))
    cp = int(cp_size if cp_size is not None else get_field(config, "context_parallel_size", 1))
    if tp < 1 or cp < 1:
        raise ValueError(f"tp_size and cp_size must be >= 1; got tp_size={tp}, cp_size={cp}")
    fp8 = uses_fp8_padding(config) if fp8_padding is None else bool(fp8_padding)
    experts = num_experts if num_experts is not None else get_field(config, "num_moe_experts", None)
    align = tp * cp * 2 if cp > 1 else tp
    sequence_align = math.lcm(_FP8_SEQUENCE_MULTIPLE, align) if fp8 else align

    mask, given_lengths = _as_mask(valid, seq_len, device)
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
    parts = [cu_padded[-1:], counts]
    check = given_lengths is not None and given_lengths.numel() > 0
    if check:
        parts.append(torch.stack([given_lengths.min(), given_lengths.max()]).to(dev))
    host = torch.cat(parts).tolist()
    if check:
        _check_lengths(given_lengths, int(host[-2]), int(host[-1]), width)
    total, tokens_per_rank = int(host[0]), tuple(int(n) for n in host[1 : 1 + cp])
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
    slot_of_token = global_slot[valid_cells]
    cell_of_slot[slot_of_token] = valid_cells
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
        padding_slots=padding_slots, slot_of_token=slot_of_token,
        num_experts=int(experts) if isinstance(experts, int) and experts > 0 else None,
    )


def _fill_rows_for(
    fill: Fill, trailing: torch.Size, like: torch.Tensor, slots: torch.Tensor, num_experts: Optional[int]
) -> torch.Tensor:
    """What padding rows (``slots``: their ordinals among all padding rows) get, broadcastable to
    ``[len(slots), *trailing]``.

    - ``"spread"``: padding row ``s`` replays experts ``(s * k + i) % num_experts`` for ``i < k``: distinct
      experts in every row, and over consecutive padding slots every expert (so every EP rank, which
      owns a contiguous block of experts) gets an equal share. Zero-filled padding instead sends every
      padded token to expert 0 and EP rank 0 (verl #7524).
    - ``"distinct"``: experts ``0..k-1`` in every padding row (never one expert twice).
    - ``"auto"`` (default): ``"spread"`` when the number of experts is known, else ``"distinct"``.
    - an integer: that value everywhere.
    """
    if fill == "auto":
        fill = "spread" if num_experts is not None and len(trailing) > 0 else "distinct"
    if fill == "spread":
        if num_experts is None:
            raise ValueError(
                "fill='spread' needs the number of experts: pass num_experts= to thd_layout or pack, "
                "or a config with num_moe_experts"
            )
        if len(trailing) == 0:
            raise ValueError("fill='spread' needs a trailing [..., topk] dimension")
        topk = trailing[-1]
        if topk > num_experts:
            raise ValueError(f"cannot spread top-{topk} padding rows over {num_experts} experts")
        experts = (slots.unsqueeze(1) * topk + torch.arange(topk, device=slots.device)) % num_experts
        shape = (slots.shape[0],) + (1,) * (len(trailing) - 1) + (topk,)
        return experts.view(shape).expand(slots.shape[0], *trailing).to(like.dtype)
    if fill == "distinct":
        if len(trailing) == 0:
            return torch.zeros((), dtype=like.dtype, device=like.device)
        # A padding token replayed as [0, 0, ...] would pick one expert topk times, which shrinks
        # the routing map below tokens * topk; distinct experts keep every count exact.
        return torch.arange(trailing[-1], device=like.device).to(like.dtype).expand(trailing)
    if isinstance(fill, str):
        raise ValueError(f"fill must be an int, 'auto', 'spread' or 'distinct'; got {fill!r}")
    return torch.full(trailing, fill, dtype=like.dtype, device=like.device)


def pack(
    per_sample: torch.Tensor,
    layout: ThdLayout,
    *,
    cp_rank: Optional[int] = None,
    fill: Fill = "auto",
    num_experts: Optional[int] = None,
) -> torch.Tensor:
    """``[batch, seq, *rest]`` to the packed order: ``[local_tokens, *rest]`` of ``cp_rank``.

    ``per_sample`` may also be a jagged nested tensor ``[batch, j, *rest]`` (verl's form): its
    values are the tokens of each sample in order. With ``cp_rank=None`` and CP > 1, returns every
    rank's tensor: ``[cp, local_tokens, *rest]``. Padding slots get ``fill`` (see
    :func:`_fill_rows_for`; by default spread over all experts when ``num_experts`` is known, on
    the layout or here).
    """
    experts = num_experts if num_experts is not None else layout.num_experts
    if per_sample.is_nested:
        rows, trailing = _nested_rows(per_sample, layout)
        source_of_slot = _token_of_slot(layout)
    else:
        _check_grid(per_sample, layout)
        trailing = per_sample.shape[2:]
        rows = per_sample.reshape(layout.batch_size * layout.seq_len, *trailing)
        source_of_slot = layout.cell_of_slot
    local = layout.local_tokens
    ranks = range(layout.cp_size) if cp_rank is None else (_check_rank(cp_rank, layout),)
    packed = []
    for rank in ranks:  # CP ranks, not samples
        if rows.shape[0] == 0:
            out = rows.new_empty((local, *trailing))
        else:
            out = rows.index_select(0, source_of_slot[rank * local : (rank + 1) * local])
        slots = layout.padding_slots[rank]
        # Padding rows numbered over all ranks in order: consecutive numbers spread evenly.
        first = sum(local - layout.tokens_per_rank[r] for r in range(rank))
        ordinal = torch.arange(first, first + slots.shape[0], device=slots.device)
        out[slots] = _fill_rows_for(fill, trailing, rows, ordinal, experts)
        packed.append(out)
    if cp_rank is not None or layout.cp_size == 1:
        return packed[0]
    return torch.stack(packed)


def _nested_rows(nested: torch.Tensor, layout: ThdLayout) -> tuple[torch.Tensor, torch.Size]:
    lengths = _nested_lengths(nested)
    if lengths.shape[0] != layout.batch_size or not torch.equal(lengths.to(layout.lengths.device), layout.lengths):
        raise ValueError(
            f"the nested tensor's sample lengths {lengths.tolist()[:8]} differ from the layout's "
            f"{layout.lengths.tolist()[:8]}: build the layout from the same batch"
        )
    values = nested.values()
    return values, values.shape[1:]


def _token_of_slot(layout: ThdLayout) -> torch.Tensor:
    """[total_tokens] the token ordinal (sample-major) each slot holds, 0 for padding slots."""
    token_of_slot = torch.zeros(layout.total_tokens, dtype=torch.long, device=layout.slot_of_token.device)
    token_of_slot[layout.slot_of_token] = torch.arange(layout.slot_of_token.shape[0], device=token_of_slot.device)
    return token_of_slot


def unpack(
    packed: Union[torch.Tensor, Sequence[torch.Tensor]],
    layout: ThdLayout,
    *,
    fill: int = 0,
    nested: bool = False,
) -> torch.Tensor:
    """Packed ``[tokens, *rest]`` back to ``[batch, seq, *rest]``; cells without a token get ``fill``.

    With ``nested=True``, returns a jagged nested tensor ``[batch, j, *rest]`` of the tokens only
    (verl's form; ``fill`` is unused). Under CP, pass every rank's tensor (gathered by the
    caller): ``[cp, local_tokens, *rest]`` or a list of ``cp`` tensors in rank order. Under
    sequence parallelism, gather the TP shards first.
    """
    rows = _all_slots(packed, layout)
    if nested:
        values = rows.index_select(0, layout.slot_of_token)
        offsets = layout.cu_seqlens.to(values.device)
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    if rows.shape[0] == 0 or layout.slot_of_cell.numel() == 0 or rows[0].numel() == 0:
        # Nothing packed (empty batch, every sample of length 0) or nothing per token: all fill.
        return rows.new_full((layout.batch_size, layout.seq_len, *rows.shape[1:]), fill)
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


def sequence_parallel_shard(
    packed: torch.Tensor, layout: ThdLayout, tp_rank: int, *, stacked: Optional[bool] = None
) -> torch.Tensor:
    """The rows a router on ``tp_rank`` sees under sequence parallelism (a contiguous slice).

    ``packed`` is one CP rank's ``[local_tokens, *rest]`` (``pack(..., cp_rank=r)``), or, under
    context parallelism, every rank's ``[cp, local_tokens, *rest]`` as ``pack`` returns without
    ``cp_rank``; the result keeps the form: ``[local_tokens / tp, *rest]`` or
    ``[cp, local_tokens / tp, *rest]``. ``stacked=None`` tells the two apart by shape and raises
    :class:`PackedShapeError` when a shape fits both (``local_tokens == cp`` and a trailing
    dimension of ``local_tokens``); pass ``stacked`` to say which it is. Any other shape raises
    :class:`PackedShapeError` too: slicing the wrong dimension would replay other tokens' experts.
    """

    if not 0 <= tp_rank < layout.tp_size:
        raise ValueError(f"tp_rank {tp_rank} is outside tensor-parallel size {layout.tp_size}")
    if stacked is None:
        stacked = _is_stacked(packed, layout)
    rows = packed.shape[1] if stacked else packed.shape[0]
    if stacked and (layout.cp_size == 1 or packed.dim() < 2 or packed.shape[0] != layout.cp_size):
        raise PackedShapeError(
            f"expected every CP rank's packed rows [cp={layout.cp_size}, {layout.local_tokens}, ...]; "
            f"got shape {list(packed.shape)}"
        )
    if rows % layout.tp_size:
        raise PackedShapeError(
            f"{rows} packed rows do not split evenly over tensor-parallel size "
            f"{layout.tp_size}: pack with the layout the model input was built with (it pads every "
            "sample to a multiple of tp)"
        )
    if rows != layout.local_tokens:
        raise PackedShapeError(
            f"expected {layout.local_tokens} packed rows per CP rank ([local_tokens, ...], or "
            f"[cp={layout.cp_size}, local_tokens, ...] for every rank); got shape {list(packed.shape)}"
        )
    per_rank = rows // layout.tp_size
    if stacked:
        return packed[:, tp_rank * per_rank : (tp_rank + 1) * per_rank]
    return packed[tp_rank * per_rank : (tp_rank + 1) * per_rank]


def _is_stacked(packed: torch.Tensor, layout: ThdLayout) -> bool:
    """Whether ``packed`` is ``pack``'s every-rank form ``[cp, local_tokens, ...]`` (CP > 1 only)."""

    local = layout.local_tokens
    every_rank = layout.cp_size > 1 and packed.dim() >= 2 and tuple(packed.shape[:2]) == (layout.cp_size, local)
    if every_rank and packed.shape[0] == local:
        raise PackedShapeError(
            f"shape {list(packed.shape)} is both one CP rank's [{local}, ...] rows and every rank's "
            f"[cp={layout.cp_size}, {local}, ...]: pass stacked=True or stacked=False"
        )
    return every_rank


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
