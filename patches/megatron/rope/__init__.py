"""Rotary position embeddings: ``megatron.mla_thd_cp_rope``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
