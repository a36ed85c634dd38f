"""MTP with TP=2 (vocab-parallel output layer), two real gloo ranks on CPU.

Same weights, unpatched run first: the patched run attaches the same MTP losses on every rank; the
output layer's shard gets no MTP gradient with the head detached (default) and some with it
trained; every MTP parameter trains. (The NCCL multi-GPU version is the multi-GPU issue's.)
"""

from __future__ import annotations

import pytest
from _multiprocess import rendezvous, spawn_ranks
from mtp_checks import tensor_parallel_mtp_rank

pytestmark = pytest.mark.slow


def test_tp2_mtp_losses_equal_upstreams_and_the_head_stays_detached(tmp_path) -> None:
    outcome = spawn_ranks(tensor_parallel_mtp_rank, 2, (2, rendezvous(tmp_path)), timeout=400)
    assert outcome == [(True, 0.0, True, True), (True, 0.0, True, True)], outcome
