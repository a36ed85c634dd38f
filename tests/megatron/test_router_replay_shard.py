"""``sequence_parallel_shard`` on both forms ``pack`` returns.

Under sequence parallelism a router on TP rank ``t`` of CP rank ``c`` sees rows
``[t * local / tp, (t + 1) * local / tp)`` of CP rank ``c``'s packed input. ``pack`` returns one
CP rank's ``[local, ...]`` with ``cp_rank`` and every rank's ``[cp, local, ...]`` without it; the
stacked form used to be sliced along the CP dimension, silently handing back other tokens' rows.
"""

from __future__ import annotations

import pytest
import torch
from patchkit.patches.megatron import router_replay as replay

TOPK = 2


def _per_sample(lengths: list[int], seq_len: int) -> torch.Tensor:
    """[batch, seq, TOPK] with a distinct value per (sample, token, k), so any wrong row shows."""
    grid = torch.full((len(lengths), seq_len, TOPK), -1)
    for b, n in enumerate(lengths):
        tokens = 1000 * b + 10 * torch.arange(n)
        grid[b, :n] = torch.stack([tokens + k for k in range(TOPK)], dim=-1)
    return grid


def _expected(per_sample: torch.Tensor, layout: replay.ThdLayout, cp_rank: int, tp_rank: int) -> torch.Tensor:
    """The TP rank's contiguous share of one CP rank's packed rows, computed from the per-rank form."""
    rows = replay.pack(per_sample, layout, cp_rank=cp_rank, fill=-1)
    share = layout.local_tokens // layout.tp_size
    return rows[tp_rank * share : (tp_rank + 1) * share]


@pytest.mark.parametrize(("tp", "cp"), [(2, 2), (2, 3), (4, 2)])
def test_the_stacked_form_gives_every_cp_rank_its_own_tp_share(tp, cp):
    lengths = [5, 9, 3]
    per_sample = _per_sample(lengths, 12)
    layout = replay.thd_layout(lengths, seq_len=12, tp_size=tp, cp_size=cp)
    stacked = replay.pack(per_sample, layout, fill=-1)
    assert stacked.shape[:2] == (cp, layout.local_tokens)
    for tp_rank in range(tp):
        shard = replay.sequence_parallel_shard(stacked, layout, tp_rank)
        assert shard.shape == (cp, layout.local_tokens // tp, TOPK)
        for cp_rank in range(cp):
            assert torch.equal(shard[cp_rank], _expected(per_sample, layout, cp_rank, tp_rank)), (tp_rank, cp_rank)


@pytest.mark.parametrize(("tp", "cp"), [(2, 1), (2, 2), (4, 2)])
def test_one_cp_ranks_form_gives_the_tp_share_of_that_rank(tp, cp):
    lengths = [5, 9, 3]
    per_sample = _per_sample(lengths, 12)
    layout = replay.thd_layout(lengths, seq_len=12, tp_size=tp, cp_size=cp)
    for cp_rank in range(cp):
        rows = replay.pack(per_sample, layout, cp_rank=cp_rank, fill=-1)
        for tp_rank in range(tp):
            shard = replay.sequence_parallel_shard(rows, layout, tp_rank)
            assert torch.equal(shard, _expected(per_sample, layout, cp_rank, tp_rank))


def test_shards_of_every_tp_rank_put_back_together_are_the_rank_rows():
    layout = replay.thd_layout([7, 2], seq_len=8, tp_size=2, cp_size=2)
    stacked = replay.pack(_per_sample([7, 2], 8), layout, fill=-1)
    shards = [replay.sequence_parallel_shard(stacked, layout, t) for t in range(2)]
    assert torch.equal(torch.cat(shards, dim=1), stacked)


def test_a_shape_that_fits_both_forms_is_refused_unless_stacked_says_which():
    # cp=2, tp=1, one sample of 2 tokens padded to 4: local_tokens == cp == 2, so a [2, 2] tensor is
    # one rank's rows with top-2 and every rank's rows with no trailing dimension.
    layout = replay.thd_layout([2], seq_len=4, tp_size=1, cp_size=2)
    assert layout.local_tokens == 2
    ambiguous = torch.arange(4).reshape(2, 2)
    with pytest.raises(replay.PackedShapeError, match="pass stacked=True or stacked=False"):
        replay.sequence_parallel_shard(ambiguous, layout, 0)
    assert torch.equal(replay.sequence_parallel_shard(ambiguous, layout, 0, stacked=True), ambiguous)
    assert torch.equal(replay.sequence_parallel_shard(ambiguous, layout, 0, stacked=False), ambiguous)


@pytest.mark.parametrize("shape", [(3, 8, TOPK), (2, 6, TOPK), (6, TOPK), (16, TOPK)])
def test_a_tensor_of_another_layout_is_refused_with_a_typed_error(shape):
    # cp=2, tp=2: local_tokens 8. [3, 8] has the wrong CP size, [2, 6] and [6] the wrong row count
    # (divisible by tp, so the old code sliced them), [16] is the whole flattened stack.
    layout = replay.thd_layout([5, 3], seq_len=6, tp_size=2, cp_size=2)
    assert layout.local_tokens == 8
    with pytest.raises(replay.PackedShapeError) as caught:
        replay.sequence_parallel_shard(torch.zeros(shape, dtype=torch.long), layout, 0)
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, replay.RouterReplayError)


def test_stacked_true_without_context_parallelism_is_refused():
    layout = replay.thd_layout([3, 4], seq_len=4, tp_size=2)
    with pytest.raises(replay.PackedShapeError, match="cp=1"):
        replay.sequence_parallel_shard(torch.zeros(1, 8, TOPK), layout, 0, stacked=True)
