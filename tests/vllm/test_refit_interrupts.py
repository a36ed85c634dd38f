"""A refit interrupted anywhere by a real signal leaves the model exactly old or exactly new (real vLLM, CPU).

A trace function sends the process a real SIGINT (or a SIGTERM whose Python handler calls
``sys.exit``) at one line of the refit's own code, for many lines across the whole refit: prepare,
the loaders' wrappers while vLLM loads, the checks, processing, the commit and the rollback.
``os.kill`` runs the Python handler before it returns, so the signal lands exactly at that line,
as one arriving then would. After each: every parameter and buffer holds the bytes of the old
checkpoint or of the new one, at its old address; nothing is left prepared, claimed or wrapped;
``torch.Tensor``'s write methods and the signal handlers are back; the next refit works.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from nvfp4_helpers import bits, items, kernel_state
from patchkit.patches.vllm.refit import _impl as _refit_impl
from patchkit.patches.vllm.refit import _plain as _refit_plain
from patchkit.patches.vllm.refit import _writes as _refit_writes
from patchkit.patches.vllm.refit import abort_refit, finish_refit, prepare_refit, refit, refit_weights
from test_refit_all_or_nothing import A, B, dummy_started

REFIT_CODE = str(Path(_refit_impl.__file__).parent)
STRIDE = int(os.environ.get("PATCHKIT_INTERRUPT_STRIDE", "7"))  #: every 7th line of the refit's code


def refit_lines(run: Callable[[], Any], fire_at: int | None, signum: int) -> int:
    """Run ``run`` tracing the refit's code; at its ``fire_at``-th line send ``signum``. Lines seen."""
    seen = 0

    def local(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal seen
        if event == "line":
            if seen == fire_at:
                os.kill(os.getpid(), signum)
            seen += 1
        return local

    def calls(frame: FrameType, event: str, arg: object) -> Any:
        return local if frame.f_code.co_filename.startswith(REFIT_CODE) else None

    sys.settrace(calls)
    try:
        run()
    finally:
        sys.settrace(None)
    return seen


def reference(weights: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    clean = dummy_started()
    refit_weights(clean, items(dict(weights)))
    return {name: bits(data) for name, (_, data) in kernel_state(clean).items()}


def serves(model: torch.nn.Module, expected: dict[str, torch.Tensor], pointers: dict[str, int]) -> bool:
    state = kernel_state(model)
    assert {n: p for n, (p, _) in state.items()} == pointers, "a serving tensor moved"
    return all(torch.equal(bits(data), expected[name]) for name, (_, data) in state.items())


def assert_nothing_left(model: torch.nn.Module, handlers: tuple[Any, Any]) -> None:
    assert not _refit_writes.installed(), "torch.Tensor's write wrappers outlived the refit"
    for name in ("copy_", "fill_", "zero_", "__setitem__"):
        assert getattr(torch.Tensor, name) is getattr(torch._C.TensorBase, name), name
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert _refit_plain.GUARD_ATTR not in model.__dict__
    leftovers = [name for name in model.__dict__ if name.startswith("_patchkit")]
    assert not leftovers, leftovers
    for _, layer, state in _refit_impl._recorded_layers(model):
        assert state.staging is None
        assert not [n for n in layer.__dict__ if n.startswith("_patchkit") and n != "_patchkit_refit_state"]


def exits(signum: int, frame: object) -> None:
    sys.exit(143)  # what a framework's SIGTERM handler does


def one_call(model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]]) -> None:
    refit_weights(model, items(dict(weights)))


def with_block(model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]]) -> None:
    with refit(model):
        model.load_weights(items(dict(weights)))


def in_steps(model: torch.nn.Module, weights: list[tuple[str, torch.Tensor]]) -> None:
    """The split API, used as documented: whoever catches the interrupt aborts."""
    try:
        prepare_refit(model)
        model.load_weights(items(dict(weights)))
        finish_refit(model)
    except BaseException:
        abort_refit(model)
        raise


@pytest.mark.parametrize("how", [one_call, with_block, in_steps], ids=["refit_weights", "with-refit", "steps"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM-handler-exits"])
def test_a_signal_at_any_line_of_a_refit_leaves_it_exactly_old_or_exactly_new(
    nvfp4_refit_patch: None, vllm_config: object, how: Callable[..., None], signum: int
) -> None:
    previous_term = signal.getsignal(signal.SIGTERM)
    if signum == signal.SIGTERM:
        signal.signal(signal.SIGTERM, exits)
    try:
        handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
        checkpoints = {"A": A, "B": B}
        served = {name: reference(weights) for name, weights in checkpoints.items()}
        model = dummy_started()
        refit_weights(model, items(dict(A)))
        pointers = {n: p for n, (p, _) in kernel_state(model).items()}
        current = "A"
        lines = refit_lines(lambda: how(model, B), None, signum)
        current = "B"
        assert lines > 200
        outcomes: dict[str, int] = {}
        for point in range(0, lines, STRIDE):
            target = "A" if current == "B" else "B"
            try:
                refit_lines(lambda target=target: how(model, checkpoints[target]), point, signum)
                outcome = "completed"
            except (KeyboardInterrupt, SystemExit) as exc:
                outcome = type(exc).__name__
            assert_nothing_left(model, handlers)
            now = [name for name in (target, current) if serves(model, served[name], pointers)]
            assert now, f"line {point}: the model serves neither {current} nor {target} ({outcome})"
            assert outcome != "completed" or now == [target], f"line {point}: completed but serves {current}"
            current = now[0]
            outcomes[f"{outcome}->{'new' if current == target else 'old'}"] = outcomes.get(
                f"{outcome}->{'new' if current == target else 'old'}", 0) + 1
        # Not vacuous: interrupts rolled refits back, and some landed during the commit (then new).
        interrupted = "KeyboardInterrupt" if signum == signal.SIGINT else "SystemExit"
        assert outcomes.get(f"{interrupted}->old", 0) > 5, outcomes
        assert outcomes.get(f"{interrupted}->new", 0) > 0, outcomes
        target = "A" if current == "B" else "B"
        refit_weights(model, items(dict(checkpoints[target])))
        assert serves(model, served[target], pointers)
    finally:
        signal.signal(signal.SIGTERM, previous_term)


def test_a_handler_that_returns_interrupts_nothing(nvfp4_refit_patch: None, vllm_config: object) -> None:
    """A SIGTERM handler that only sets a flag (no exception): the refit completes, the flag is set."""
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        model = dummy_started()
        refit_weights(model, items(dict(A)))
        lines = refit_lines(lambda: one_call(model, B), None, signal.SIGTERM)
        for point in (1, lines // 3, lines // 2, lines - 2):
            refit_lines(lambda: one_call(model, A), point, signal.SIGTERM)
        assert seen == [signal.SIGTERM] * 4
        expected = reference(A)
        assert all(torch.equal(bits(d), expected[n]) for n, (_, d) in kernel_state(model).items())
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_second_signal_during_the_rollback_waits_for_it(nvfp4_refit_patch: None, vllm_config: object) -> None:
    """Two Ctrl-C in a row: the first interrupts the load, the second arrives during the rollback and
    is delivered after it; the model is old and nothing is left behind."""
    model = dummy_started()
    refit_weights(model, items(dict(A)))
    before = kernel_state(model)
    handlers = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    restore = _refit_plain.PlainGuard.restore
    calls: list[int] = []

    def restore_with_a_second_interrupt(self: _refit_plain.PlainGuard) -> None:
        calls.append(1)
        os.kill(os.getpid(), signal.SIGINT)
        restore(self)

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for i, item in enumerate(B):
            if i == len(B) // 2:
                os.kill(os.getpid(), signal.SIGINT)
            yield item

    _refit_plain.PlainGuard.restore = restore_with_a_second_interrupt  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            refit_weights(model, stream())
    finally:
        _refit_plain.PlainGuard.restore = restore  # type: ignore[method-assign]
    assert calls == [1]
    assert_nothing_left(model, handlers)
    for name, (_, data) in before.items():
        assert torch.equal(bits(kernel_state(model)[name][1]), bits(data)), name
