"""MTP loss under context parallelism (CP=2: two gloo ranks on CPU, and two GPUs over NCCL): a rank
with no loss token.

With CP each rank normalises its MTP loss by its own rolled token count; a rank whose shard holds
only masked tokens divides by zero in upstream 0.14-0.16 and every gradient becomes NaN (verl
#6464). The patch clamps the count, as upstream does from 0.17.
"""

from __future__ import annotations

import pytest
import torch
from _multiprocess import rendezvous, spawn_ranks
from mtp_checks import context_parallel_zero_mask_rank

pytestmark = pytest.mark.slow

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
BACKENDS = [
    pytest.param("gloo", id="gloo"),
    pytest.param("nccl", id="nccl",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")]),
]


def _run_two_ranks(patched: bool, folder, backend: str) -> dict[int, tuple[bool, bool]]:
    outcome = spawn_ranks(context_parallel_zero_mask_rank, 2, (2, rendezvous(folder), patched, backend), timeout=900)
    return dict(enumerate(outcome))


@pytest.mark.parametrize("backend", BACKENDS)
def test_cp_rank_without_loss_tokens_gets_finite_loss_and_gradients(tmp_path, backend: str) -> None:
    outcome = _run_two_ranks(patched=True, folder=tmp_path, backend=backend)
    # Rank 1 holds no loss token even after the roll, so its MTP layers rightly get zero gradient.
    assert outcome == {0: (True, True), 1: (True, False)}, outcome
