"""Typed errors for replayed indices that cannot belong to the tokens being routed.

Wraps ``RouterReplay.get_replay_topk`` as the router module sees it: upstream's class from
megatron-core 0.16 (where ``router.py`` imports it), patchkit's backport below 0.16 (where
``megatron.router_replay`` adds it under the same name). Upstream (0.16.1 to 0.19.2) replays with
``scores.gather(1, indices)`` unchecked, so a target with more rows than the router has tokens
fails deep inside ``gather`` with a size error, one with fewer rows routes the first tokens only
and fails later or not at all, and REPLAY_BACKWARD with nothing queued fails with
``pop from empty list``. The shape check reads tensor shapes only.

It also applies the replay policies of ``router_replay._policy``: a missing target raises
:class:`ReplayTargetMissingError` or lets the router route itself; rows with an index outside
``[0, num_experts)`` (the ``-1`` sentinel) raise :class:`ReplayIndexInvalidError` (one host sync per
layer and pass) or take the router's own choice. A replay object of another framework's class
(verl's) is passed through untouched: patchkit stands aside.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Optional

import torch

from .._errors import ReplayIndexInvalidError, ReplayIndexMismatchError, ReplayTargetMissingError
from . import _policy as policy

logger = logging.getLogger("patchkit.megatron.router_replay")

_REPLAY_FORWARD = "replay_forward"
_REPLAY_BACKWARD = "replay_backward"
_warned_foreign: set[str] = set()


def _layer_of(replay: Any) -> Any:
    """The layer's name: its key when a model-scoped call labelled it, else its position among
    all routers built (its MoE layer ordinal in the process), or -1."""
    label = getattr(replay, "_patchkit_layer", None)
    if label is not None:
        return label
    for index, instance in enumerate(getattr(type(replay), "global_router_replay_instances", ())):
        if instance is replay:
            return index
    return -1


def _target_for(replay: Any, action: str) -> Optional[torch.Tensor]:
    if action == _REPLAY_FORWARD:
        return replay.target_topk_idx
    queue = replay.replay_backward_list
    return queue[0] if len(queue) else None


def is_foreign(replay: Any) -> bool:
    """A replay object of another implementation (verl's class keeps ``router_instances`` and no
    ``global_router_replay_instances``): patchkit's checks stand aside for it."""
    return not hasattr(type(replay), "global_router_replay_instances")


def check_replay_target(replay: Any, scores: torch.Tensor, topk: int) -> Optional[str]:
    """Raise if the tensor ``replay`` is about to replay does not fit ``scores`` ([tokens, experts]).

    Returns ``"missing"`` where the target is missing and the policy says to fall back, else None.
    """
    action = getattr(replay.router_replay_action, "value", None)
    if action not in (_REPLAY_FORWARD, _REPLAY_BACKWARD):
        return None
    target = _target_for(replay, action)
    if target is None:
        if policy.policy_of(replay, "on_missing") == policy.NATIVE:
            return "missing"
        hint = (
            "every set_targets() queues one tensor per layer for REPLAY_BACKWARD, and each "
            "recomputed forward consumes one"
            if action == _REPLAY_BACKWARD
            else "call set_targets() before the forward"
        )
        raise ReplayTargetMissingError(
            f"MoE layer {_layer_of(replay)}: action {action!r} but no target indices are "
            f"queued ({hint}; or set_policy(on_missing='native') to let the router route itself)"
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
    return None


def _invalid_rows(target: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[tokens] bool: rows holding an index outside [0, num_experts) (the -1 sentinel, stale rows)."""
    return ((target < 0) | (target >= num_experts)).any(dim=1)


def _native_topk(default_compute_topk: Callable[..., Any], scores: torch.Tensor, topk: int,
                 num_groups: Any, group_topk: Any) -> Any:
    return default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)


def wrap_get_replay_topk(original: Callable[..., Any]) -> Callable[..., Any]:
    """``RouterReplay.get_replay_topk`` that checks the replayed tensor and applies the policies."""

    @functools.wraps(original)
    def get_replay_topk(
        self: Any,
        scores: torch.Tensor,
        topk: int,
        num_groups: Optional[int] = None,
        group_topk: Optional[int] = None,
        default_compute_topk: Optional[Callable[..., Any]] = None,
    ) -> Any:
        if is_foreign(self):
            _warn_foreign(type(self))
            return original(self, scores, topk, num_groups, group_topk, default_compute_topk)
        if check_replay_target(self, scores, topk) == "missing":
            policy.count_missing(self, _layer_of(self), self.router_replay_action.value)
            return _native_topk(default_compute_topk, scores, topk, num_groups, group_topk)
        action = getattr(self.router_replay_action, "value", None)
        if action not in (_REPLAY_FORWARD, _REPLAY_BACKWARD):
            return original(self, scores, topk, num_groups, group_topk, default_compute_topk)
        target = _target_for(self, action)
        invalid = _invalid_rows(target.to(scores.device), scores.shape[1])
        if policy.policy_of(self, "on_invalid") == policy.RAISE:
            bad = int(invalid.sum())  # the one host sync of this policy
            if bad:
                raise ReplayIndexInvalidError(
                    layer=_layer_of(self), rows=bad, tokens=scores.shape[0], num_experts=scores.shape[1],
                    action=action, example=target[invalid.to(target.device)][0].tolist(),
                )
            return original(self, scores, topk, num_groups, group_topk, default_compute_topk)
        _, native = _native_topk(default_compute_topk, scores, topk, num_groups, group_topk)
        mended = torch.where(invalid.unsqueeze(1), native, target.to(device=scores.device, dtype=native.dtype))
        policy.count_invalid_rows(self, invalid.sum())
        return _replay_with(self, action, mended, original, scores, topk, num_groups, group_topk, default_compute_topk)

    return get_replay_topk


def _replay_with(replay: Any, action: str, mended: torch.Tensor, original: Callable[..., Any], *args: Any) -> Any:
    """Let upstream's method replay ``mended`` in place of the stored target, then put it back.

    REPLAY_FORWARD keeps its target for later passes (whose scores, and so native choices, differ);
    REPLAY_BACKWARD consumes its queue head either way.
    """
    if action == _REPLAY_BACKWARD:
        replay.replay_backward_list[0] = mended
        return original(replay, *args)
    stored = replay.target_topk_idx
    replay.target_topk_idx = mended
    try:
        return original(replay, *args)
    finally:
        replay.target_topk_idx = stored


def _warn_foreign(cls: type) -> None:
    name = f"{cls.__module__}.{cls.__qualname__}"
    if name not in _warned_foreign:
        _warned_foreign.add(name)
        logger.warning(
            "router replay object %s is not megatron-core's or patchkit's (another framework's replay "
            "patch); patchkit's replay checks stand aside for it", name,
        )
