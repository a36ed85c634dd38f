"""The tiny MoE GPT and helpers the router replay tests share with the self-checks.

One copy: ``patchkit.patches.megatron._checks._tiny_moe``. Also what the router replay test files share:
the patch ids they apply and the installed megatron-core release.
"""

from importlib.metadata import version

from patchkit.patches.megatron._checks._tiny_moe import (  # noqa: F401
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

#: The router replay patches every replay test applies (``moe_replay`` fixture in conftest).
REPLAY_PATCH_IDS = (
    "megatron.router_replay",
    "megatron.router_replay_validation",
    "megatron.moe_alltoall_replay_token_count",
)


def megatron_version() -> tuple[int, int]:
    """(major, minor) of the installed megatron-core."""
    major, minor = version("megatron-core").split(".")[:2]
    return int(major), int(minor)


__all__ = [
    "REPLAY_PATCH_IDS", "megatron_version",
    "Batch", "NUM_EXPERTS", "RoutingCapture", "TOPK", "VOCAB_SIZE", "build_tiny_moe",
    "causal_batch", "dispatchers", "forward_loss", "routers", "shift_expert_bias", "thd_batch",
]
