"""Patches for megatron."""
