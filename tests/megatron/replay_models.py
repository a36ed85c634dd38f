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


def record_then_replay(model, batch, *, backward_action):
    """Record one forward/backward, move the routing (expert bias), replay the recorded targets in a
    forward and run its backward under ``backward_action``; the gradients (recorded, replayed)."""
    from patchkit.patches.megatron import router_replay as replay

    replay.set_action("record")
    forward_loss(model, batch).sum().backward()
    recorded = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    targets = [t.clone() for t in replay.recorded()]

    shift_expert_bias(model)
    model.zero_grad(set_to_none=True)
    replay.set_targets(targets)
    replay.set_action("replay_forward")
    loss = forward_loss(model, batch).sum()
    replay.set_action(backward_action)
    loss.backward()
    return recorded, [p.grad for p in model.parameters() if p.grad is not None]
