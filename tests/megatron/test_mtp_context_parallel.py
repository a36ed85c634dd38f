"""MTP loss under context parallelism (CP=2, two real gloo ranks on CPU): a rank with no loss token.

With CP each rank normalises its MTP loss by its own rolled token count; a rank whose shard holds
only masked tokens divides by zero in upstream 0.14-0.16 and every gradient becomes NaN (verl
#6464). The patch clamps the count, as upstream does from 0.17.
"""

from __future__ import annotations

import pytest
from _multiprocess import rendezvous, spawn_ranks
from mtp_checks import context_parallel_zero_mask_rank

pytestmark = pytest.mark.slow


def _run_two_ranks(patched: bool, folder) -> dict[int, tuple[bool, bool]]:
    outcome = spawn_ranks(context_parallel_zero_mask_rank, 2, (2, rendezvous(folder), patched), timeout=300)
    return dict(enumerate(outcome))


def test_cp_rank_without_loss_tokens_gets_finite_loss_and_gradients(tmp_path) -> None:
    outcome = _run_two_ranks(patched=True, folder=tmp_path)
    # Rank 1 holds no loss token even after the roll, so its MTP layers rightly get zero gradient.
    assert outcome == {0: (True, True), 1: (True, False)}, outcome
