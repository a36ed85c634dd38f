"""Patches for vllm."""
