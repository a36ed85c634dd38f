"""Router replay on ``TopKRouter`` for megatron-core 0.14 and 0.15 (native from 0.16).

Derived from megatron-core 0.16.1, which added replay in three places; this module backports each:

- ``TopKRouter.__init__`` creates ``self.router_replay = RouterReplay()`` when
  ``config.moe_enable_routing_replay`` is set. 0.14/0.15's ``TransformerConfig`` has no such
  field, so it is read with ``get_field`` (set it on the config object before building the model;
  ``router_replay.enable(config)`` does that).
- ``TopKRouter.routing`` passes ``router_replay=self.router_replay`` to
  ``topk_routing_with_score_function``. 0.14/0.15's ``routing`` has a fixed call, so instead of
  copying ``routing`` (which differs between 0.14 and 0.15) the wrapper publishes the router's
  replay state in a context variable for the duration of the call.
- ``topk_routing_with_score_function`` routes its top-k selection through
  ``router_replay.get_replay_topk``. When no replay action is set the wrapper calls the original
  untouched, so non-replay routing is exactly upstream's; with an action set it runs
  :func:`_replayed_topk_routing`, 0.16.1's body of that function (which equals 0.15.3's apart
  from the replay hook; 0.14.0 lacks only the deterministic-algorithms branch, whose result equals
  the scatter branch for the distinct indices top-k produces).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from typing import Any, Optional

import torch
from megatron.core.transformer.moe.moe_utils import group_limited_topk

from patchkit.runtime.probing import get_field

from ..._errors import RouterReplayError
from .backport import RouterReplay

_active_replay: contextvars.ContextVar[Optional[RouterReplay]] = contextvars.ContextVar(
    "patchkit_active_router_replay", default=None
)


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    """``TopKRouter.__init__`` that also creates the layer's replay state when enabled."""

    @functools.wraps(original)
    def __init__(self: Any, config: Any, *args: Any, **kwargs: Any) -> None:
        original(self, config, *args, **kwargs)
        self.router_replay = (
            RouterReplay() if get_field(config, "moe_enable_routing_replay", False) else None
        )

    return __init__


def wrap_routing(original: Callable[..., Any]) -> Callable[..., Any]:
    """``TopKRouter.routing`` that makes this router's replay state visible to the top-k call."""

    @functools.wraps(original)
    def routing(self: Any, logits: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        replay = getattr(self, "router_replay", None)
        # Another framework's replay object (verl's patched_init) is its business: stand aside.
        if not isinstance(replay, RouterReplay) or replay.router_replay_action is None:
            return original(self, logits, *args, **kwargs)
        token = _active_replay.set(replay)
        try:
            return original(self, logits, *args, **kwargs)
        finally:
            _active_replay.reset(token)

    return routing


def wrap_topk_routing(original: Callable[..., Any]) -> Callable[..., Any]:
    """The name ``router.topk_routing_with_score_function``, replay-aware like 0.16's."""

    @functools.wraps(original)
    def topk_routing_with_score_function(
        logits: torch.Tensor,
        topk: int,
        use_pre_softmax: bool = False,
        num_groups: Optional[int] = None,
        group_topk: Optional[int] = None,
        scaling_factor: Optional[float] = None,
        score_function: str = "softmax",
        expert_bias: Optional[torch.Tensor] = None,
        fused: bool = False,
        router_replay: Optional[RouterReplay] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        replay = router_replay if router_replay is not None else _active_replay.get()
        if not isinstance(replay, RouterReplay) or replay.router_replay_action is None:
            return original(
                logits, topk, use_pre_softmax=use_pre_softmax, num_groups=num_groups,
                group_topk=group_topk, scaling_factor=scaling_factor,
                score_function=score_function, expert_bias=expert_bias, fused=fused,
            )
        if fused:
            # 0.16's fused path returns before the replay hook, silently routing afresh; a
            # replay that does not replay is the bug this patch exists to prevent.
            raise RouterReplayError(
                "router replay needs the unfused top-k path: set moe_router_fusion=False "
                f"(action {replay.router_replay_action.value!r} was requested)"
            )
        return _replayed_topk_routing(
            logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
            score_function, expert_bias, replay,
        )

    return topk_routing_with_score_function


def _replayed_topk_routing(
    logits: torch.Tensor,
    topk: int,
    use_pre_softmax: bool,
    num_groups: Optional[int],
    group_topk: Optional[int],
    scaling_factor: Optional[float],
    score_function: str,
    expert_bias: Optional[torch.Tensor],
    router_replay: RouterReplay,
) -> tuple[torch.Tensor, torch.Tensor]:
    """0.16.1's unfused ``topk_routing_with_score_function`` with a replay state present."""
    assert logits.dim() == 2, f"Expected 2D logits [num_tokens, num_experts], got {logits.dim()}."
    num_tokens, num_experts = logits.shape

    def default_topk(scores, topk, num_groups=None, group_topk=None):
        if group_topk:
            return group_limited_topk(
                scores=scores, topk=topk, num_tokens=num_tokens, num_experts=num_experts,
                num_groups=num_groups, group_topk=group_topk,
            )
        return torch.topk(scores, k=topk, dim=1)

    def compute_topk(scores, topk, num_groups=None, group_topk=None):
        return router_replay.get_replay_topk(scores, topk, num_groups, group_topk, default_topk)

    if score_function == "softmax":
        if use_pre_softmax:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits)
            probs, top_indices = compute_topk(scores, topk, num_groups, group_topk)
        else:
            scores, top_indices = compute_topk(logits, topk, num_groups, group_topk)
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)
    elif score_function == "sigmoid":
        scores = torch.sigmoid(logits.float()).type_as(logits)
        if expert_bias is not None:
            _, top_indices = compute_topk(scores + expert_bias, topk, num_groups, group_topk)
            scores = torch.gather(scores, dim=1, index=top_indices).type_as(logits)
        else:
            scores, top_indices = compute_topk(scores, topk, num_groups, group_topk)
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else scores
    else:
        raise ValueError(f"Invalid score_function: {score_function}")

    if scaling_factor:
        probs = probs * scaling_factor

    if torch.are_deterministic_algorithms_enabled():
        routing_probs = torch.zeros_like(logits)
        rows = torch.arange(num_tokens, device=logits.device).unsqueeze(1)
        routing_probs.index_put_((rows, top_indices), probs, accumulate=False)
        routing_map = torch.zeros_like(logits, dtype=logits.dtype)
        routing_map.index_put_(
            (rows, top_indices), torch.ones_like(probs, dtype=routing_map.dtype), accumulate=False
        )
        routing_map = routing_map.bool()
    else:
        routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
        routing_map = torch.zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    return routing_probs, routing_map
