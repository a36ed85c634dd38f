"""Attention layers: ``megatron.mla_v_padding``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
