"""vLLM's headless start-up run in a worker thread (a Ray actor's), as verl and ROLL start it.

Declaration only (see docs/writing-patches.md). ``vllm/entrypoints/cli/serve.py``'s ``run_headless``
(and ``run_multi_api_server``) install SIGTERM/SIGINT handlers with ``signal.signal`` after building
the engine config and before starting the engine processes. RL frameworks call ``run_headless`` in
a thread of a Ray actor (verl: ``asyncio.to_thread(run_headless, args)``), where CPython raises
``ValueError: signal only works in main thread of the main interpreter`` and the engine never
starts. verl wraps the call in ``SuppressSignalInThread``, which swaps ``signal.signal`` for the
whole process while it runs; the patch changes only what that module sees.

Ranges: ``run_headless``'s signal calls are the same in 0.24.0, 0.29.0 and 0.33.0 (read from the
wheels, and tested in all three); 0.25-0.28 and 0.30-0.32 lie inside the range unrun. No release is
``native``: none of the three guards these calls (vLLM #14972 guarded another path in 2025).
"""

from __future__ import annotations

from patchkit import Patch, Replace, Variant

SERVE = "vllm.entrypoints.cli.serve"

PATCHES = (
    Patch(
        id="vllm.serve_signals_main_thread",
        self_check="._checks.serve_signals_main_thread:check_serve_signals_main_thread",
        summary=(
            "vLLM's run_headless (and run_multi_api_server) start from a worker thread: their signal "
            "handlers are installed on the main thread only."
        ),
        why=(
            "run_headless calls signal.signal, which raises ValueError outside the main thread; RL frameworks "
            "start it in a Ray actor thread (verl's SuppressSignalInThread)."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/entrypoints/cli/serve.py",
        removal="Declare native once run_headless checks for the main thread itself (not in 0.33).",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(Replace(f"{SERVE}:signal", "._serve_signals_main_thread:MAIN_THREAD_SIGNALS"),),
                label="serve-module-signals",
            ),
        ),
    ),
)
