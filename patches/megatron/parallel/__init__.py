"""Parallel-state helpers frameworks import: ``megatron.tp_group_if_none_helper``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
