"""Packing router indices into the THD order the model sees, and back (FP8 / TP / CP padding)."""

from __future__ import annotations

import math
import types

import pytest
import torch
from patchkit.patches.megatron import router_replay as replay

PAD = -1  # fill used below so padding slots are visible in the expected layouts


def _per_sample(lengths: list[int], seq_len: int, topk: int = 2) -> torch.Tensor:
    """[batch, seq, topk] where sample b's token t holds (100 * b + t, 100 * b + t + 50)."""
    grid = torch.full((len(lengths), seq_len, topk), PAD)
    for b, n in enumerate(lengths):
        tokens = 100 * b + torch.arange(n)
        grid[b, :n] = torch.stack([tokens + 50 * k for k in range(topk)], dim=-1)
    return grid


def _tokens(packed: torch.Tensor) -> list[str]:
    """Name each packed slot 's<sample>t<token>' or 'PAD', from the first top-k column."""
    return ["PAD" if v == PAD else f"s{v // 100}t{v % 100}" for v in packed[..., 0].tolist()]


def _layout(lengths, **kwargs):
    return replay.thd_layout(lengths, seq_len=max(lengths) + 2, **kwargs)


# --- hand-computed layouts ---------------------------------------------------------------------


def test_plain_tp1_packs_samples_end_to_end():
    layout = _layout([3, 5], tp_size=1)
    packed = replay.pack(_per_sample([3, 5], 7), layout, fill=PAD)
    assert layout.cu_seqlens_padded.tolist() == [0, 3, 8]
    assert _tokens(packed) == ["s0t0", "s0t1", "s0t2", "s1t0", "s1t1", "s1t2", "s1t3", "s1t4"]


def test_plain_tp2_pads_each_sample_to_a_multiple_of_two():
    layout = _layout([3, 5], tp_size=2)
    packed = replay.pack(_per_sample([3, 5], 7), layout, fill=PAD)
    assert layout.cu_seqlens_padded.tolist() == [0, 4, 10]
    assert _tokens(packed) == [
        "s0t0", "s0t1", "s0t2", "PAD", "s1t0", "s1t1", "s1t2", "s1t3", "s1t4", "PAD",
    ]


def test_fp8_tp1_pads_samples_to_16_and_the_total_to_128_on_the_last_sample():
    layout = _layout([3, 5], tp_size=1, fp8_padding=True)
    packed = replay.pack(_per_sample([3, 5], 7), layout, fill=PAD)
    # 3 -> 16, 5 -> 16; total 32 -> 128 by padding the last sample to 112.
    assert layout.cu_seqlens_padded.tolist() == [0, 16, 128]
    names = _tokens(packed)
    assert names[:3] == ["s0t0", "s0t1", "s0t2"] and set(names[3:16]) == {"PAD"}
    assert names[16:21] == ["s1t0", "s1t1", "s1t2", "s1t3", "s1t4"] and set(names[21:]) == {"PAD"}


def test_fp8_tp4_uses_lcm_of_16_and_tp_and_a_total_multiple_of_tp_times_128():
    layout = _layout([17, 5, 40], tp_size=4, fp8_padding=True)
    # lcm(16, 4) = 16: 17 -> 32, 5 -> 16, 40 -> 48; total 96 -> 512 (= 4 * 128) on the last one.
    assert layout.cu_seqlens_padded.tolist() == [0, 32, 48, 512]
    assert layout.sequence_align == 16 and layout.total_tokens == 512


def test_fp8_tp3_sequence_alignment_is_lcm_48():
    layout = _layout([5], tp_size=3, fp8_padding=True)
    assert layout.sequence_align == 48
    assert layout.cu_seqlens_padded.tolist() == [0, 384]  # 48, then up to 3 * 128


def test_cp2_splits_each_padded_sample_into_four_chunks_two_per_rank():
    layout = _layout([3, 5], tp_size=1, cp_size=2)
    # align = 1 * 2 * 2 = 4: 3 -> 4 (chunks of 1), 5 -> 8 (chunks of 2).
    # Rank 0 holds chunks 0 and 3 of every sample, rank 1 chunks 1 and 2.
    assert layout.cu_seqlens_padded.tolist() == [0, 4, 12]
    rank0 = replay.pack(_per_sample([3, 5], 7), layout, cp_rank=0, fill=PAD)
    rank1 = replay.pack(_per_sample([3, 5], 7), layout, cp_rank=1, fill=PAD)
    assert _tokens(rank0) == ["s0t0", "PAD", "s1t0", "s1t1", "PAD", "PAD"]
    assert _tokens(rank1) == ["s0t1", "s0t2", "s1t2", "s1t3", "s1t4", "PAD"]
    assert layout.tokens_per_rank == (3, 5)


def test_cp2_fp8_pads_the_last_sample_so_the_total_is_a_multiple_of_align_times_128():
    layout = _layout([3, 5], tp_size=1, cp_size=2, fp8_padding=True)
    # align 4, lcm(16, 4) = 16: 3 -> 16, 5 -> 16, total 32 -> 512 with the last sample at 496.
    assert layout.cu_seqlens_padded.tolist() == [0, 16, 512]
    rank0 = _tokens(replay.pack(_per_sample([3, 5], 7), layout, cp_rank=0, fill=PAD))
    # Sample 0 (chunks of 4): rank 0 holds tokens 0-3 and 12-15; sample 1 (chunks of 124)
    # starts at local slot 16 / 2 = 8 and all five tokens are in its chunk 0.
    assert rank0[:4] == ["s0t0", "s0t1", "s0t2", "PAD"]
    assert rank0[8:13] == ["s1t0", "s1t1", "s1t2", "s1t3", "s1t4"]
    assert layout.tokens_per_rank == (8, 0)


def test_attention_mask_with_holes_packs_the_masked_positions_in_order():
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    layout = replay.thd_layout(mask, tp_size=2)
    values = torch.arange(10).view(2, 5, 1)
    packed = replay.pack(values, layout, fill=PAD)
    assert packed.squeeze(1).tolist() == [1, 2, 4, PAD, 5, 6]
    back = replay.unpack(packed, layout, fill=PAD)
    assert back.squeeze(-1).tolist() == [[PAD, 1, 2, PAD, 4], [5, 6, PAD, PAD, PAD]]


def test_padding_slots_replay_distinct_experts_by_default():
    layout = _layout([3], tp_size=4)
    packed = replay.pack(torch.full((1, 5, 4), 7), layout)
    assert packed[3].tolist() == [0, 1, 2, 3]  # one padding token: experts 0..topk-1, no repeats


# --- configuration probing ---------------------------------------------------------------------


def test_config_without_fp8_field_means_no_fp8_padding():
    foreign = types.SimpleNamespace(tensor_model_parallel_size=2)  # another stack's config
    layout = _layout([3, 5], config=foreign)
    assert not layout.fp8_padding and layout.cu_seqlens_padded.tolist() == [0, 4, 10]


@pytest.mark.parametrize(("fp8", "padded"), [("e4m3", True), ("hybrid", True), (None, False)])
def test_fp8_format_on_config_decides_fp8_padding(fp8, padded):
    config = types.SimpleNamespace(fp8=fp8, tensor_model_parallel_size=1, context_parallel_size=1)
    assert _layout([3], config=config).fp8_padding is padded


def test_megatron_transformer_config_is_probed_for_fp8_tp_and_cp():
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    config.fp8 = "e4m3"  # set after construction: __post_init__ would ask for TransformerEngine
    config.tensor_model_parallel_size = 2
    layout = _layout([3], config=config)
    assert layout.fp8_padding and layout.tp_size == 2 and layout.cp_size == 1
    assert layout.total_tokens == 256


# --- round trips against a per-sample reference --------------------------------------------------


def _reference_layout(lengths, tp, cp, fp8):
    """Straightforward per-sample padding (the rule written out), for comparison."""
    align = tp * cp * 2 if cp > 1 else tp
    seq_align = math.lcm(16, align) if fp8 else align
    padded = [-(-n // seq_align) * seq_align for n in lengths]
    if fp8:
        padded[-1] += -sum(padded) % (align * 128)
    return padded


def _reference_pack(per_sample, lengths, padded, cp):
    """One CP rank's tokens at a time, sample by sample (chunk r and 2cp-1-r per rank)."""
    ranks = []
    for rank in range(cp):
        pieces = []
        for b, (n, p) in enumerate(zip(lengths, padded, strict=True)):
            sample = torch.full((p, *per_sample.shape[2:]), PAD)
            sample[:n] = per_sample[b, :n]
            if cp == 1:
                pieces.append(sample)
                continue
            h = p // (2 * cp)
            pieces += [sample[rank * h : (rank + 1) * h], sample[(2 * cp - 1 - rank) * h : (2 * cp - rank) * h]]
        ranks.append(torch.cat(pieces))
    return ranks


@pytest.mark.parametrize("fp8", [False, True], ids=["plain", "fp8"])
@pytest.mark.parametrize(("tp", "cp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)])
def test_random_lengths_round_trip_and_match_the_per_sample_reference(tp, cp, fp8):
    generator = torch.Generator().manual_seed(tp * 10 + cp + fp8)
    lengths = torch.randint(1, 60, (7,), generator=generator).tolist()
    seq_len, layers, topk = 64, 3, 4
    per_sample = torch.randint(0, 32, (7, seq_len, layers, topk), generator=generator)
    layout = replay.thd_layout(lengths, seq_len=seq_len, tp_size=tp, cp_size=cp, fp8_padding=fp8)

    padded = _reference_layout(lengths, tp, cp, fp8)
    assert layout.cu_seqlens_padded.tolist() == [0, *torch.tensor(padded).cumsum(0).tolist()]
    assert layout.local_tokens % tp == 0  # sequence parallel splits it evenly
    expected = _reference_pack(per_sample, lengths, padded, cp)

    ranks = [replay.pack(per_sample, layout, cp_rank=r, fill=PAD) for r in range(cp)]
    for got, want in zip(ranks, expected, strict=True):
        assert torch.equal(got, want)

    back = replay.unpack(ranks, layout)
    valid = torch.arange(seq_len) < torch.tensor(lengths).unsqueeze(1)
    assert torch.equal(back[valid], per_sample[valid])
    assert (back[~valid] == 0).all()


def test_pack_without_cp_rank_returns_every_rank_stacked():
    layout = _layout([3, 5], cp_size=2)
    per_sample = _per_sample([3, 5], 7)
    stacked = replay.pack(per_sample, layout)
    assert stacked.shape[:2] == (2, layout.local_tokens)
    assert torch.equal(replay.unpack(stacked, layout)[0, :3], per_sample[0, :3])


def test_sequence_parallel_shard_is_the_contiguous_tp_slice():
    from patchkit.patches.megatron.router_replay._packing import sequence_parallel_shard

    layout = _layout([3, 5], tp_size=2)
    packed = replay.pack(_per_sample([3, 5], 7), layout, fill=PAD)
    assert torch.equal(sequence_parallel_shard(packed, layout, 1), packed[5:])


def test_unpack_rejects_a_tensor_of_another_layout():
    layout = _layout([3, 5], tp_size=1, fp8_padding=True)
    with pytest.raises(ValueError, match="expected 128 packed tokens"):
        replay.unpack(torch.zeros(8, 2, dtype=torch.long), layout)


def test_api_module_imports_neither_torch_nor_megatron():
    """``apply_all()`` imports every public catalogue module at process start: it must stay light."""
    import subprocess
    import sys

    script = (
        "import sys; from patchkit.patches.megatron.router_replay import enable, for_model, set_action; "
        "print(sorted(m for m in ('torch', 'megatron') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
