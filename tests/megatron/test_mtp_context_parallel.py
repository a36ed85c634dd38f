"""MTP loss under context parallelism (CP=2: two gloo ranks on CPU, and two GPUs over NCCL): a rank
with no loss token.

With CP each rank normalises its MTP loss by its own rolled token count; a rank whose shard holds
only masked tokens divides by zero in upstream 0.14-0.16 and every gradient becomes NaN (verl
#6464). The patch clamps the count, as upstream does from 0.17.
"""

from __future__ import annotations

import multiprocessing
import tempfile

import pytest
import torch
from mtp_checks import context_parallel_zero_mask_rank

pytestmark = pytest.mark.slow

TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
BACKENDS = [
    pytest.param("gloo", id="gloo"),
    pytest.param("nccl", id="nccl",
                 marks=[pytest.mark.gpu, pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")]),
]


def _run_two_ranks(patched: bool, backend: str) -> dict[int, tuple[bool, bool]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as rendezvous:  # a file store: no port to pick
        init_method = f"file://{rendezvous}/store"
        ranks = [context.Process(target=context_parallel_zero_mask_rank,
                                 args=(rank, 2, init_method, patched, results, backend)) for rank in range(2)]
        for process in ranks:
            process.start()
        try:
            outcome = {}
            for _ in ranks:
                rank, finite, mtp_trained = results.get(timeout=240)
                outcome[rank] = (finite, mtp_trained)
            for process in ranks:
                process.join(timeout=60)
                assert process.exitcode == 0, f"a CP rank exited with {process.exitcode}"
        finally:
            for process in ranks:  # a rank left waiting in a collective once its peer failed
                if process.is_alive():
                    process.kill()
                    process.join(timeout=30)
    return outcome


@pytest.mark.parametrize("backend", BACKENDS)
def test_cp_rank_without_loss_tokens_gets_finite_loss_and_gradients(backend: str) -> None:
    outcome = _run_two_ranks(patched=True, backend=backend)
    # Rank 1 holds no loss token even after the roll, so its MTP layers rightly get zero gradient.
    assert outcome == {0: (True, True), 1: (True, False)}, outcome
