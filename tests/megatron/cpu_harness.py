"""The CPU stand-ins for Megatron-Core's CUDA-only calls, shipped with the self-checks.

The code lives in ``patchkit.patches.megatron._checks._cpu_stand_in`` (its docstring lists exactly what is
redirected), so ``patchkit doctor`` on a CPU and the tests use one harness.
"""

from patchkit.patches.megatron._checks._cpu_stand_in import (  # noqa: F401
    cpu_megatron,
    destroy_parallel_state,
    initialize_parallel_state,
)

__all__ = ["cpu_megatron", "destroy_parallel_state", "initialize_parallel_state"]
