"""Router replay API inputs: validate before changing anything, no silent clamping."""

from __future__ import annotations

import pytest
import torch
from moe_harness import cpu_moe
from patchkit.patches.megatron import router_replay as replay
from replay_models import TOPK, build_tiny_moe

import patchkit


@pytest.fixture
def moe_replay(megatron_cpu):
    with cpu_moe(), patchkit.applied("megatron.router_replay", "megatron.router_replay_validation"):
        replay.reset()
        yield
        replay.reset()


@pytest.mark.parametrize("bad", [None, torch.zeros(32), torch.zeros(32, TOPK)])
def test_set_targets_validates_every_entry_before_changing_any_router(moe_replay, bad):
    build_tiny_moe()
    good = torch.zeros(32, TOPK, dtype=torch.long)
    with pytest.raises(replay.RouterReplayError, match="layer 1"):
        replay.set_targets([good, bad])
    assert replay.pending_backward() == [0, 0]
    assert all(r.target_topk_idx is None for r in replay.routers())


@pytest.mark.parametrize("lengths", [[5, 13], [-1, 4]])
def test_thd_layout_rejects_lengths_outside_the_grid(lengths):
    with pytest.raises(ValueError, match=r"must lie in \[0, seq_len=12\]"):
        replay.thd_layout(lengths, seq_len=12)


@pytest.mark.parametrize("lengths", [[], [0, 0, 0]])
@pytest.mark.parametrize("fp8", [False, True])
def test_empty_and_all_zero_batches_give_empty_results(lengths, fp8):
    layout = replay.thd_layout(lengths, seq_len=6, fp8_padding=fp8, tp_size=2)
    assert layout.total_tokens == 0
    batch = len(lengths)
    packed = replay.pack(torch.ones(batch, 6, 3, TOPK, dtype=torch.long), layout)
    assert packed.shape == (0, 3, TOPK)
    back = replay.unpack(packed, layout, fill=-1)
    assert back.shape == (batch, 6, 3, TOPK) and bool((back == -1).all())
    assert replay.unpack(packed, layout, nested=True).offsets().tolist() == [0] * (batch + 1)


def test_sequence_parallel_shard_rejects_rows_not_divisible_by_tp():
    layout = replay.thd_layout([3, 4], seq_len=4, tp_size=2)
    with pytest.raises(ValueError, match="do not split evenly over tensor-parallel size 2"):
        replay.sequence_parallel_shard(torch.zeros(7, TOPK), layout, 0)
    assert replay.sequence_parallel_shard(torch.arange(8), layout, 1).tolist() == [4, 5, 6, 7]
