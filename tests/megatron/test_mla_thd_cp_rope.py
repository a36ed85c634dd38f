"""``megatron.mla_thd_cp_rope``: MLA with packed (THD) sequences on a context-parallel group whose
config says ``context_parallel_size=1`` (AReaL's MLA configs).

Upstream's own ``MLASelfAttention`` (local spec), driven through ``get_query_key_value_tensors``;
each CP rank is one call on its zig-zag tokens with the CP group's ``size()``/``rank()`` stood in
(``patches/megatron/rope/_checks/_mla_thd_cp.py`` says why that is all MLA reads of it here). The
reference is the same layer on the whole packed batch with CP=1.
"""

from __future__ import annotations

import pytest
import torch
from doctor_verdicts import verdict_of
from patchkit.patches.megatron._checks._harness import megatron_on
from patchkit.patches.megatron._errors import MlaRopeTableError
from patchkit.patches.megatron.rope._checks._mla_thd_cp import CP_SIZE, build_mla, compare_cp_ranks, zigzag_rows

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "megatron.mla_thd_cp_rope"


pytestmark = pytest.mark.usefixtures("patches_restored")


def _errors_and_differences(rope_type: str, config_cp_size: int):
    with megatron_on("cpu"):
        outcomes = compare_cp_ranks(build_mla(rope_type, config_cp_size=config_cp_size), "cpu")
    return [(o.error, o.max_difference) for o in outcomes]


def test_zigzag_rows_are_megatrons_thd_split():
    # Sequences of 8 and 4 tokens on 2 ranks: 4 chunks each, rank 0 chunks 0 and 3, rank 1 chunks 1 and 2.
    assert zigzag_rows((8, 4), 2, 0) == [0, 1, 6, 7, 8, 11]
    assert zigzag_rows((8, 4), 2, 1) == [2, 3, 4, 5, 9, 10]


@pytest.mark.parametrize("rope_type", ["rope", "yarn"])
def test_upstream_is_right_when_the_config_names_the_cp_size(rope_type):
    """What the patch claims against: upstream with a consistent config gives the CP=1 rows."""
    for error, difference in _errors_and_differences(rope_type, config_cp_size=CP_SIZE):
        assert error is None and difference <= 1e-5


@pytest.mark.parametrize("rope_type", ["rope", "yarn"])
def test_upstream_fails_when_the_config_says_cp_1_on_a_cp_group(rope_type):
    """The bug: the table is cut to the 12 local tokens; rank 0's later half of the 16-token sequence
    needs rows 12-15 (rank 1's halves, rows 4-7 and 8-11, happen to fit)."""
    (rank_0_error, _), (rank_1_error, rank_1_difference) = _errors_and_differences(rope_type, config_cp_size=1)
    assert rank_0_error is not None and "must match the size of tensor" in rank_0_error
    assert rank_1_error is None and rank_1_difference <= 1e-5


@pytest.mark.parametrize("rope_type", ["rope", "yarn"])
def test_patched_cp_ranks_equal_the_unsplit_batch(rope_type):
    with patchkit.applied(PATCH) as (status,):
        assert status.to_dict()["state"] == "applied"
        outcomes = _errors_and_differences(rope_type, config_cp_size=1)
    assert all(error is None and difference <= 1e-5 for error, difference in outcomes), outcomes


def test_patch_leaves_a_consistent_config_and_cp_1_alone():
    with patchkit.applied(PATCH):
        assert all(e is None and d <= 1e-5 for e, d in _errors_and_differences("rope", config_cp_size=CP_SIZE))
        with megatron_on("cpu"):
            outcomes = compare_cp_ranks(build_mla("rope", config_cp_size=1), "cpu", cp_size=1)
    assert [(o.error, o.max_difference) for o in outcomes] == [(None, 0.0)]


def test_a_table_that_does_not_start_at_position_0_is_refused_by_name():
    from patchkit.patches.megatron.rope._mla_thd_cp_rope import full_thd_rope_table

    cu_seqlens = torch.tensor([0, 16, 20], dtype=torch.int32)
    offset_table = (torch.arange(3, 8, dtype=torch.float32).view(-1, 1, 1, 1) * torch.ones(1, 1, 1, 4))
    with pytest.raises(MlaRopeTableError, match="5 rows, the longest packed sequence needs 16.*row 0 is not"):
        full_thd_rope_table(offset_table, cu_seqlens)
    table = torch.arange(16, dtype=torch.float32).view(-1, 1, 1, 1) * torch.rand(1, 1, 1, 4)
    assert torch.equal(full_thd_rope_table(table[:8], cu_seqlens), table)
    assert full_thd_rope_table(table, cu_seqlens) is table


def test_check_is_verified():
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.mla_thd_cp_rope")
def test_check_fails_with_upstreams_apply_rotary_pos_emb():
    verdict = verdict_of(PATCH, applied=True, as_upstream=True)
    assert verdict.verdict == FAILED
    assert "rope RoPE, CP rank 0 of 2: q/k equal the CP=1 rows of its tokens" in verdict.message
    assert "RuntimeError: The size of tensor a" in verdict.message


def test_wrapper_finds_cu_seqlens_and_cp_group_by_keyword_or_position():
    """MLA passes them by keyword; a caller passing upstream's order by position is served the same."""
    from patchkit.patches.megatron.rope._checks._mla_thd_cp import ContextParallelRank
    from patchkit.patches.megatron.rope._mla_thd_cp_rope import wrap_apply_rotary_pos_emb

    rows_seen = []

    def upstream(t, freqs, config, cu_seqlens=None, mscale=1.0, cp_group=None):
        rows_seen.append(freqs.size(0))
        return t

    apply = wrap_apply_rotary_pos_emb(upstream)
    table = torch.arange(16, dtype=torch.float32).view(-1, 1, 1, 1) * torch.ones(1, 1, 1, 4)
    cu_seqlens = torch.tensor([0, 16, 20], dtype=torch.int32)
    tokens = torch.zeros(10, 1, 4)
    apply(tokens, table[:10], None, cu_seqlens, 1.0, ContextParallelRank(2, 0))
    apply(tokens, table[:10], config=None, cu_seqlens=cu_seqlens, cp_group=ContextParallelRank(2, 0))
    apply(tokens, table[:10], config=None, cu_seqlens=cu_seqlens, cp_group=ContextParallelRank(1, 0))
    apply(tokens, table[:10], config=None)
    assert rows_seen == [16, 16, 10, 10]
