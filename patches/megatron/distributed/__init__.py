"""Patches for megatron-core's gradient and pipeline communication (``megatron.core.distributed``,
``megatron.core.pipeline_parallel``).

A family sub-package: its declaration modules are found by the catalogue like the family's own, its
implementation modules are named ``_<patch>.py`` and its self-checks sit in ``_checks/``.
"""
