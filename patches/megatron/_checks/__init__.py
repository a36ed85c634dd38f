"""Self-checks of the megatron patches, one module per patch (run by ``patchkit doctor``).

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by the tests in ``tests/megatron``.
On a CPU, Megatron's CUDA-only calls are redirected for the duration of the check
(:mod:`._cpu_stand_in`); on a GPU the model runs there. Megatron's parallel state is started for the
check (one rank) unless the process already has one, and torn down afterwards if the check started it.
"""
