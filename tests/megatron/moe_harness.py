"""The MoE CPU stand-ins (see ``cpu_harness``); shipped in ``patchkit.patches.megatron._checks._cpu_stand_in``."""

from patchkit.patches.megatron._checks._cpu_stand_in import cpu_moe  # noqa: F401

__all__ = ["cpu_moe"]
