"""Self-check of ``vllm.serve_signals_main_thread``: vLLM's ``run_headless`` started in a worker thread
(as verl starts it in a Ray actor) gets to its engine start and leaves the process's signal handlers alone."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ._headless_serve import run_headless_in_a_thread


def check_serve_signals_main_thread(context: CheckContext) -> None:
    """vLLM's ``run_headless`` started in a worker thread gets to its engine start; the process's handlers stay."""
    outcome = run_headless_in_a_thread(context.device)
    error = outcome["error"]
    expect(error is None, "vLLM's run_headless started in a worker thread reaches the engine start",
           "no error", f"{type(error).__name__}: {error}" if error is not None else None)
    expect(outcome["before"] == outcome["after"], "the process's SIGTERM/SIGINT handlers after it", "unchanged",
           f"{outcome['before']} -> {outcome['after']}")
