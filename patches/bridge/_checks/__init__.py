"""Self-checks of the bridge patches, one module per patch (run by ``patchkit doctor``).

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by ``tests/bridge``. Each check calls the
Bridge function the patch changes (or, where the patch is native, the one that does the job upstream)
on a tiny Megatron model or on parameter names, and compares what comes back with what a ModelOpt QAT
export needs. Megatron runs on one rank (``patchkit.patches.megatron._checks._harness.megatron_on``).
"""
