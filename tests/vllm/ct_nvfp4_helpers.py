"""Compressed-tensors NVFP4 helpers for tests/vllm: shared with the self-check, they live in
``patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint`` (re-exported here)."""

from __future__ import annotations

from patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint import (
    EXPERTS,
    FP8_KV_CACHE,
    HIDDEN,
    INTERMEDIATE,
    CtLinears,
    CtMoe,
    ct_nvfp4_config,
    linear_checkpoint,
    moe_checkpoint,
)

__all__ = ["EXPERTS", "FP8_KV_CACHE", "HIDDEN", "INTERMEDIATE", "CtLinears", "CtMoe", "ct_nvfp4_config",
           "linear_checkpoint", "moe_checkpoint"]
