"""The CPU stand-ins for Megatron-Core's CUDA-only calls, shipped with the self-checks.

The code lives in ``patchkit.patches.megatron._checks._cpu_stand_in`` (its docstring lists exactly what is
redirected), so ``patchkit doctor`` on a CPU and the tests use one harness.
"""

import contextlib
from collections.abc import Iterator

from patchkit.patches.megatron._checks._cpu_stand_in import (
    cpu_megatron,
    destroy_parallel_state,
    initialize_parallel_state,
)

__all__ = ["cpu_megatron", "destroy_parallel_state", "initialize_parallel_state", "megatron_state_on_cpu"]


@contextlib.contextmanager
def megatron_state_on_cpu() -> Iterator[None]:
    """Megatron parallel state (TP=PP=CP=EP=1) on a one-rank gloo group, CUDA-only calls redirected,
    torn down on exit: what the ``megatron_cpu`` fixtures of tests/megatron and tests/modelopt give."""
    with cpu_megatron():
        initialize_parallel_state()
        try:
            yield
        finally:
            destroy_parallel_state()
