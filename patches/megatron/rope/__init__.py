"""Rotary position embeddings: ``megatron.mla_thd_cp_rope``, ``megatron.mrope_thd_per_token``,
``megatron.fused_mla_yarn_non_pow2``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
