"""Self-check scaffolding the megatron families share: the harness, the tiny models, the CPU stand-ins.

Each family keeps its own checks in its ``_checks/`` (one module per patch, named after it); they are
run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by the tests in ``tests/megatron``.
On a CPU, Megatron's CUDA-only calls are redirected for the duration of the check
(:mod:`._cpu_stand_in`); on a GPU the model runs there. Megatron's parallel state is started for the
check (one rank) unless the process already has one, and torn down afterwards if the check started it.
"""
