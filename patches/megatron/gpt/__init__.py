"""``GPTModel`` itself: ``megatron.output_processor``.

A family package: its declaration modules, their implementation modules and ``_checks/``; it has no
public helper API.
"""
