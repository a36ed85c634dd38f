"""Memory management around megatron-core: ``megatron.tms_hook_mode`` (torch_memory_saver).

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
