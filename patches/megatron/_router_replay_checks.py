"""Typed errors for replayed indices that cannot belong to the tokens being routed.

Wraps ``RouterReplay.get_replay_topk`` as the router module sees it: upstream's class from
megatron-core 0.16 (where ``router.py`` imports it), patchkit's backport below 0.16 (where
``megatron.router_replay`` adds it under the same name). Upstream (0.16.1 to 0.19.2) replays with
``scores.gather(1, indices)`` unchecked, so a target with more rows than the router has tokens
fails deep inside ``gather`` with a size error, one with fewer rows routes the first tokens only
and fails later or not at all, and REPLAY_BACKWARD with nothing queued fails with
``pop from empty list``. This check reads tensor shapes only: no host sync, nothing per element.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Optional

import torch

from .router_replay_api import ReplayIndexMismatchError, ReplayTargetMissingError

_REPLAY_FORWARD = "replay_forward"
_REPLAY_BACKWARD = "replay_backward"


def _layer_of(replay: Any) -> int:
    """The replay state's position among all routers built (its MoE layer ordinal), or -1."""
    for index, instance in enumerate(type(replay).global_router_replay_instances):
        if instance is replay:
            return index
    return -1


def _target_for(replay: Any, action: str) -> Optional[torch.Tensor]:
    if action == _REPLAY_FORWARD:
        return replay.target_topk_idx
    queue = replay.replay_backward_list
    return queue[0] if len(queue) else None


def check_replay_target(replay: Any, scores: torch.Tensor, topk: int) -> None:
    """Raise if the tensor ``replay`` is about to replay does not fit ``scores`` ([tokens, experts])."""
    action = getattr(replay.router_replay_action, "value", None)
    if action not in (_REPLAY_FORWARD, _REPLAY_BACKWARD):
        return
    target = _target_for(replay, action)
    if target is None:
        hint = (
            "every set_targets() queues one tensor per layer for REPLAY_BACKWARD, and each "
            "recomputed forward consumes one"
            if action == _REPLAY_BACKWARD
            else "call set_targets() before the forward"
        )
        raise ReplayTargetMissingError(
            f"MoE layer {_layer_of(replay)}: action {action!r} but no target indices are "
            f"queued ({hint})"
        )
    num_tokens = scores.shape[0]
    if target.dim() != 2 or target.shape[0] != num_tokens or target.shape[1] != topk:
        raise ReplayIndexMismatchError(
            layer=_layer_of(replay),
            expected_tokens=num_tokens,
            got_tokens=target.shape[0] if target.dim() >= 1 else 0,
            topk=topk,
            got_shape=tuple(target.shape),
            action=action,
        )


def wrap_get_replay_topk(original: Callable[..., Any]) -> Callable[..., Any]:
    """``RouterReplay.get_replay_topk`` that checks the replayed tensor's shape first."""

    @functools.wraps(original)
    def get_replay_topk(self: Any, scores: torch.Tensor, topk: int, *args: Any, **kwargs: Any) -> Any:
        check_replay_target(self, scores, topk)
        return original(self, scores, topk, *args, **kwargs)

    return get_replay_topk
