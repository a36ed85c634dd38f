"""Megatron-Core's optimizers: ``megatron.hybrid_optimizer_fp32_state``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
