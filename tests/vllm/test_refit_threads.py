"""Two threads refitting one model: one refit runs, the other is refused at once, nothing is half-done.

Before, both passed the "already prepared" guard: the model served neither checkpoint, one thread got
an untyped RuntimeError, torch.Tensor's write wrappers stayed installed, and once a SIGSEGV.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

import torch
from nvfp4_helpers import bits, items, kernel_state
from patchkit.patches.vllm.refit import RefitInProgressError, abort_refit, prepare_refit, refit_weights
from patchkit.patches.vllm.refit import _writes as _refit_writes
from test_refit_all_or_nothing import A, B, dummy_started
from test_refit_interrupts import assert_nothing_left, reference


def slow(weights: list[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    for item in weights:
        time.sleep(0.001)  # widen the race: the loads of both threads overlap
        yield item


def race(*calls: Callable[[], None]) -> list[BaseException | None]:
    barrier = threading.Barrier(len(calls))
    outcomes: list[BaseException | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        try:
            calls[i]()
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    return outcomes


def test_two_threads_refitting_one_model_one_wins_the_other_is_refused(nvfp4_refit_patch: None,
                                                                       vllm_config: object) -> None:
    served = {"A": reference(A), "B": reference(B)}
    model = dummy_started()
    refit_weights(model, items(dict(A)))
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    refused = 0
    for _ in range(12):
        outcomes = race(lambda: refit_weights(model, slow(A)), lambda: refit_weights(model, slow(B)))
        assert all(o is None or isinstance(o, RefitInProgressError) for o in outcomes), outcomes
        refused += sum(o is not None for o in outcomes)
        assert_nothing_left(model, handlers)
        state = {n: bits(d) for n, (_, d) in kernel_state(model).items()}
        now = [name for name, want in served.items() if all(torch.equal(state[n], want[n]) for n in want)]
        assert len(now) == 1, "the model serves neither checkpoint"
        if outcomes[0] is None and outcomes[1] is not None:
            assert now == ["A"]
        if outcomes[1] is None and outcomes[0] is not None:
            assert now == ["B"]
    assert refused > 0, "the threads never overlapped: the test proved nothing"
    refit_weights(model, items(dict(B)))


def test_another_thread_cannot_prepare_or_abort_a_refit_in_progress(nvfp4_refit_patch: None,
                                                                     vllm_config: object) -> None:
    served_b = reference(B)
    model = dummy_started()
    refit_weights(model, items(dict(A)))
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    for second in (prepare_refit, abort_refit):
        for _ in range(5):
            loading = threading.Event()

            def stream(loading: threading.Event = loading) -> Iterator[tuple[str, torch.Tensor]]:
                for i, item in enumerate(B):
                    if i == len(B) // 2:
                        loading.set()
                        time.sleep(0.05)
                    yield item

            def meanwhile(loading: threading.Event = loading, second: Callable[..., None] = second) -> None:
                loading.wait(30)
                second(model)

            outcomes = race(lambda: refit_weights(model, stream()), meanwhile)
            assert outcomes[0] is None, outcomes
            assert isinstance(outcomes[1], RefitInProgressError), outcomes
            assert_nothing_left(model, handlers)
            assert all(torch.equal(bits(d), served_b[n]) for n, (_, d) in kernel_state(model).items())
            refit_weights(model, items(dict(A)))
    assert not _refit_writes.installed()
