"""MTP loss under context parallelism (CP=2, two real gloo ranks on CPU): a rank with no loss token.

With CP each rank normalises its MTP loss by its own rolled token count; a rank whose shard holds
only masked tokens divides by zero in upstream 0.14-0.16 and every gradient becomes NaN (verl
#6464). The patch clamps the count, as upstream does from 0.17.
"""

from __future__ import annotations

import multiprocessing

import pytest
from cpu_harness import free_port
from mtp_checks import context_parallel_zero_mask_rank

pytestmark = pytest.mark.slow


def _run_two_ranks(patched: bool) -> dict[int, tuple[bool, bool]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=context_parallel_zero_mask_rank, args=(rank, 2, port, patched, results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    outcome = {}
    for _ in ranks:
        rank, finite, mtp_trained = results.get(timeout=240)
        outcome[rank] = (finite, mtp_trained)
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a CP rank exited with {process.exitcode}"
    return outcome


def test_cp_rank_without_loss_tokens_gets_finite_loss_and_gradients() -> None:
    outcome = _run_two_ranks(patched=True)
    # Rank 1 holds no loss token even after the roll, so its MTP layers rightly get zero gradient.
    assert outcome == {0: (True, True), 1: (True, False)}, outcome
