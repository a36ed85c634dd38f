"""A framework's own router replay, the way RL frameworks carry one: their own replay class (own
action enum, own registry, never the one megatron-core's router module names) set on each router,
and their own ``routing`` that replays its indices.

What the token-count self-check and its tests drive to prove that patchkit sees replay on a router
whatever class holds the state. Set per router instance, so the classes stay untouched.
"""

from __future__ import annotations

import contextlib
import enum
import types
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Optional

import torch


class FrameworkAction(enum.Enum):
    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


class FrameworkReplayState:
    """One layer's replay state: its own class-level registry, no ``global_router_replay_instances``."""

    router_instances: ClassVar[list[FrameworkReplayState]] = []

    def __init__(self) -> None:
        self.router_replay_action: Optional[FrameworkAction] = None
        self.target_topk_idx: Optional[torch.Tensor] = None
        FrameworkReplayState.router_instances.append(self)


def framework_routing(
    router: Any, logits: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``TopKRouter.routing`` as a framework rewrites it: replayed indices scattered into the probs
    and the routing map (an index named twice sets its expert once), else the router's own top-k."""
    state = router.router_replay
    logits = logits.view(-1, router.config.num_moe_experts)
    if state.router_replay_action is FrameworkAction.REPLAY_FORWARD and state.target_topk_idx is not None:
        indices = state.target_topk_idx.to(logits.device)
    else:
        indices = torch.topk(logits, k=router.topk, dim=1).indices
    scores = torch.sigmoid(logits.float()).type_as(logits)
    probs = torch.zeros_like(logits).scatter(1, indices, scores.gather(1, indices))
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, indices, True)
    return probs, routing_map


def install_framework_replay(model: Any) -> list[FrameworkReplayState]:
    """Give every router of ``model`` a framework replay state and the framework's routing."""
    from ..._checks._tiny_moe import routers

    states = []
    for router in routers(model):
        state = FrameworkReplayState()
        router.router_replay = state
        router.routing = types.MethodType(framework_routing, router)
        states.append(state)
    return states


@contextlib.contextmanager
def framework_replaying(device: str, target_for: Callable[[int], torch.Tensor]) -> Iterator[tuple[Any, Any]]:
    """A tiny MoE GPT on ``device`` whose routers replay ``target_for(tokens)`` through the framework's
    own replay state and routing (upstream's and patchkit's replay objects stay idle); yields
    ``(model, batch)``."""
    from ..._checks._harness import moe_replay
    from ..._checks._tiny_moe import build_tiny_moe, causal_batch

    registered = list(FrameworkReplayState.router_instances)
    batch = causal_batch().to(device)
    with moe_replay(device), torch.no_grad():
        model = build_tiny_moe().to(device)
        target = target_for(batch.input_ids.numel()).to(device)
        for state in install_framework_replay(model):
            state.target_topk_idx = target
            state.router_replay_action = FrameworkAction.REPLAY_FORWARD
        try:
            yield model, batch
        finally:
            FrameworkReplayState.router_instances[:] = registered
