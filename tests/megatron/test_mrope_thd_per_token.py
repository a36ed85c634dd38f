"""``megatron.mrope_thd_per_token``: multimodal RoPE on packed (THD) sequences, position ids split
over context-parallel ranks with the tokens (ROLL's sequence packing).

Upstream's own ``SelfAttention`` (local spec, mRoPE config) run up to core attention, with the
table of upstream's ``MultimodalRotaryEmbedding``; each CP rank is one call on its zig-zag tokens
with the CP group's ``size()``/``rank()`` stood in. The reference is ROLL's computation
(``patches/megatron/rope/_checks/_mrope_thd.py`` cites ROLL's functions it is written from).
"""

from __future__ import annotations

import pytest
import torch
from doctor_verdicts import verdict_of
from packaging.version import Version
from patchkit.patches.megatron._checks._harness import megatron_on
from patchkit.patches.megatron.rope._checks._mla_thd_cp import ContextParallelRank, zigzag_rows
from patchkit.patches.megatron.rope._checks._mrope_thd import (
    build_attention,
    compare_with_roll,
    mrope_position_ids,
    rolls_rotation,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "megatron.mrope_thd_per_token"

pytestmark = pytest.mark.usefixtures("patches_restored")


def _differences(cp_size: int = 2):
    with megatron_on("cpu"):
        outcomes = compare_with_roll(build_attention(), "cpu", cp_size=cp_size)
    assert all(o.error is None for o in outcomes), outcomes
    return [o.max_difference for o in outcomes]


def _megatron_core() -> Version:
    from importlib.metadata import version

    return Version(version("megatron-core"))


def test_position_ids_are_qwen_vl_style_and_split_with_the_tokens():
    position_ids = mrope_position_ids((16, 8, 8))
    # Image patches: temporal 4, height 4-5, width 4-7; the text after it from 8.
    assert position_ids[:, 4:12].tolist() == [[4] * 8, [4, 4, 4, 4, 5, 5, 5, 5], [4, 5, 6, 7] * 2]
    assert position_ids[:, 12:16].tolist() == [[8, 9, 10, 11]] * 3
    # ROLL's _pack_to_thd on CP rank 0 of 2: of the 16-token sequence chunks 0 and 3 (4 tokens each).
    assert zigzag_rows((16, 8, 8), 2, 0)[:8] == [0, 1, 2, 3, 12, 13, 14, 15]


def test_rolls_rotation_is_upstreams_bshd_rotation():
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    t = torch.randn(6, 2, 16)
    table = torch.randn(6, 1, 1, 16)
    assert torch.allclose(rolls_rotation(t, table), _apply_rotary_pos_emb_bshd(t[:, None], table).squeeze(1))


def test_upstream_rotates_cp_ranks_by_other_tokens_rows():
    """The bug: the 16-row local table is read as positions; rank 0's second half of the first
    sequence takes rows 12-15, which are the third sequence's tokens."""
    assert all(difference > 0.1 for difference in _differences())


def test_upstream_with_cp_1_is_right_from_0_15_only():
    """0.15.0 added the full-batch reading (a table of cu_seqlens[-1] rows); 0.14 gives every packed
    sequence the first sequence's rows."""
    (difference,) = _differences(cp_size=1)
    if _megatron_core() >= Version("0.15"):
        assert difference <= 1e-5
    else:
        assert difference > 0.1


def test_patched_cp_ranks_equal_rolls_rotation():
    with patchkit.applied(PATCH) as (status,):
        assert status.to_dict()["state"] == "applied"
        differences = _differences() + _differences(cp_size=1)
    assert all(difference <= 1e-5 for difference in differences), differences


def test_patch_leaves_1d_rope_tables_and_bshd_alone():
    """Without mrope_section, or without cu_seqlens, upstream is called with what it was given."""
    from patchkit.patches.megatron.rope._mrope_thd_per_token import wrap_apply_rotary_pos_emb

    calls = []

    def upstream(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
        calls.append((tuple(t.shape), cu_seqlens is not None))
        return t

    class Config:
        def __init__(self, mrope_section):
            self.mrope_section = mrope_section

    apply = wrap_apply_rotary_pos_emb(upstream)
    tokens, table = torch.zeros(8, 2, 16), torch.zeros(8, 1, 1, 16)
    cu_seqlens = torch.tensor([0, 8, 16], dtype=torch.int32)
    group = ContextParallelRank(2, 0)
    apply(tokens, table, config=Config(None), cu_seqlens=cu_seqlens, cp_group=group)
    apply(tokens, table, config=Config([4, 2, 2]), cp_group=group)
    apply(tokens, torch.zeros(16, 1, 1, 16), config=Config([4, 2, 2]), cu_seqlens=cu_seqlens, cp_group=group)
    apply(tokens, table, config=Config([4, 2, 2]), cu_seqlens=cu_seqlens, cp_group=group)
    apply(tokens, table, Config([4, 2, 2]), cu_seqlens, 1.0, group)  # upstream's order, by position
    assert calls == [((8, 2, 16), True), ((8, 2, 16), False), ((8, 2, 16), True),
                     ((8, 1, 2, 16), False), ((8, 1, 2, 16), False)]


def test_check_is_verified():
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.mrope_thd_per_token")
def test_check_fails_with_upstreams_apply_rotary_pos_emb():
    verdict = verdict_of(PATCH, applied=True, as_upstream=True)
    assert verdict.verdict == FAILED
    assert "mRoPE, CP rank 0 of 2: q/k equal ROLL's per-token rotation" in verdict.message
