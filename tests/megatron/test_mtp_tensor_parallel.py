"""MTP with TP=2 (vocab-parallel output layer), two real gloo ranks on CPU.

Same weights, unpatched run first: the patched run attaches the same MTP losses on every rank; the
output layer's shard gets no MTP gradient with the head detached (default) and some with it
trained; every MTP parameter trains. (The NCCL multi-GPU version is the multi-GPU issue's.)
"""

from __future__ import annotations

import multiprocessing

import pytest
from cpu_harness import free_port
from mtp_checks import tensor_parallel_mtp_rank

pytestmark = pytest.mark.slow


def test_tp2_mtp_losses_equal_upstreams_and_the_head_stays_detached() -> None:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=tensor_parallel_mtp_rank, args=(rank, 2, port, results)) for rank in range(2)]
    for process in ranks:
        process.start()
    outcome = dict((item[0], item[1:]) for item in (results.get(timeout=300) for _ in ranks))
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0, f"a TP rank exited with {process.exitcode}"
    assert outcome == {0: (True, 0.0, True, True), 1: (True, 0.0, True, True)}, outcome
