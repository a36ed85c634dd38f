"""Router replay state for megatron-core releases without it (0.14, 0.15).

Mirrors the public surface of upstream's ``megatron/core/transformer/moe/router_replay.py``
(megatron-core 0.16.1): the same action values, the same per-layer instance registry in build
order, the same method names and the same semantics (a target set for replay is used by every
REPLAY_FORWARD call and queued once for REPLAY_BACKWARD, which consumes the queue first in, first
out). Keeping the surface identical is what lets :mod:`patchkit.patches.megatron.router_replay`
drive this class and upstream's the same way. Written here, not copied: upstream's class is the
specification.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Sequence
from typing import ClassVar, Optional

import torch

TopkFunction = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


class RouterReplayAction(enum.Enum):
    """What a router does with its top-k selection; values equal upstream's 0.16 enum."""

    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


class RouterReplay:
    """Per-MoE-layer record/replay state, created by ``TopKRouter.__init__`` when enabled."""

    global_router_replay_instances: ClassVar[list["RouterReplay"]] = []

    def __init__(self) -> None:
        self.target_topk_idx: Optional[torch.Tensor] = None
        self.recorded_topk_idx: Optional[torch.Tensor] = None
        self.router_replay_action: Optional[RouterReplayAction] = None
        # A deque, where upstream keeps a list popped at the front: same order, O(1) pops.
        self.replay_backward_list: deque[torch.Tensor] = deque()
        RouterReplay.global_router_replay_instances.append(self)

    # --- per-layer state -------------------------------------------------------------------

    def set_target_indices(self, topk_indices: torch.Tensor) -> None:
        self.target_topk_idx = topk_indices
        self.replay_backward_list.append(topk_indices)

    def get_recorded_indices(self) -> Optional[torch.Tensor]:
        return self.recorded_topk_idx

    def record_indices(self, topk_indices: torch.Tensor) -> None:
        self.recorded_topk_idx = topk_indices

    def clear_indices(self) -> None:
        self.recorded_topk_idx = None
        self.target_topk_idx = None
        self.replay_backward_list = deque()

    def set_router_replay_action(self, router_replay_action: RouterReplayAction) -> None:
        self.router_replay_action = router_replay_action

    def clear_router_replay_action(self) -> None:
        self.router_replay_action = None

    def get_replay_topk(
        self,
        scores: torch.Tensor,
        topk: int,
        num_groups: Optional[int] = None,
        group_topk: Optional[int] = None,
        default_compute_topk: Optional[TopkFunction] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k values and indices for ``scores``, computed, recorded or replayed per the action.

        Replayed probabilities are gathered from ``scores`` at the replayed indices, so gradients
        still flow into the router through the replayed experts' scores.
        """
        action = self.router_replay_action
        if action is RouterReplayAction.RECORD:
            values, indices = default_compute_topk(
                scores, topk, num_groups=num_groups, group_topk=group_topk
            )
            self.record_indices(indices)
            return values, indices
        if action is RouterReplayAction.REPLAY_FORWARD:
            indices = self.target_topk_idx.to(scores.device)
            return scores.gather(1, indices), indices
        if action is RouterReplayAction.REPLAY_BACKWARD:
            indices = self.replay_backward_list.popleft().to(scores.device)
            return scores.gather(1, indices), indices
        return default_compute_topk(scores, topk, num_groups, group_topk)

    # --- all layers at once (upstream's static helpers) ------------------------------------

    @staticmethod
    def set_replay_data(all_layers_topk_indices: Sequence[torch.Tensor]) -> None:
        instances = RouterReplay.global_router_replay_instances
        if len(all_layers_topk_indices) != len(instances):
            raise ValueError(
                f"The number of replay tensors ({len(all_layers_topk_indices)}) "
                f"does not match instances ({len(instances)})."
            )
        for instance, indices in zip(instances, all_layers_topk_indices, strict=True):
            instance.set_target_indices(indices)

    @staticmethod
    def get_recorded_data() -> list[Optional[torch.Tensor]]:
        return [r.get_recorded_indices() for r in RouterReplay.global_router_replay_instances]

    @staticmethod
    def clear_global_indices() -> None:
        for router in RouterReplay.global_router_replay_instances:
            router.clear_indices()

    @staticmethod
    def set_global_router_replay_action(router_replay_action: RouterReplayAction) -> None:
        for router in RouterReplay.global_router_replay_instances:
            router.set_router_replay_action(router_replay_action)

    @staticmethod
    def clear_global_router_replay_action() -> None:
        for router in RouterReplay.global_router_replay_instances:
            router.clear_router_replay_action()

    @staticmethod
    def clear_global_router_replay_instances() -> None:
        RouterReplay.global_router_replay_instances.clear()
