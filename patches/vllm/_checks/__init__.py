"""Self-checks of the vLLM patches that are families of one, one module per patch (run by ``patchkit
doctor``, see :mod:`patchkit.selfcheck`, and by ``tests/vllm``), and the CPU stand-ins, tiny models and
drivers every vLLM family's checks share with the tests (``_cpu_stand_in``, ``_tiny_moe``,
``_gate_up_down``, ``_headless_serve``). The refit and LoRA families keep theirs in their own
``_checks/``.
"""
