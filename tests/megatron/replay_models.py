"""The tiny MoE GPT and helpers the router replay tests share with the self-checks.

One copy: ``patchkit.patches.megatron._tiny_moe``.
"""

from patchkit.patches.megatron._tiny_moe import (  # noqa: F401
    NUM_EXPERTS,
    TOPK,
    VOCAB_SIZE,
    Batch,
    RoutingCapture,
    build_tiny_moe,
    causal_batch,
    dispatchers,
    forward_loss,
    routers,
    shift_expert_bias,
    thd_batch,
)

__all__ = [
    "Batch", "NUM_EXPERTS", "RoutingCapture", "TOPK", "VOCAB_SIZE", "build_tiny_moe",
    "causal_batch", "dispatchers", "forward_loss", "routers", "shift_expert_bias", "thd_batch",
]
