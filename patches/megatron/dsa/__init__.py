"""DeepSeek sparse attention (DSA): ``megatron.dsa_hadamard_fallback``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
