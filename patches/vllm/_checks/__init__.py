"""Self-checks of the vLLM patches, one module per patch (run by ``patchkit doctor``, see
:mod:`patchkit.selfcheck`, and by ``tests/vllm``), and the CPU stand-ins, tiny models and drivers they
share with the tests (``_cpu_stand_in``, ``_tiny_moe``, ``_fp8_checkpoint``, ``_headless_serve``).
"""
