"""All-to-all dispatcher token count that stays right when replayed indices repeat an expert.

``MoEAlltoAllTokenDispatcher.preprocess`` (megatron-core 0.14.0 to 0.19.2, unchanged in this
respect) sets ``num_out_tokens = num_tokens * moe_router_topk`` for dropless routing without
quantization padding: a static count that needs no host sync because top-k never selects an expert
twice. Replayed indices can: a padding token filled with zeros replays expert 0 ``topk`` times,
the routing map holds one entry for it, and fewer rows are routed than ``num_out_tokens``. Every
permute that sizes its output from that count then disagrees with ``tokens_per_expert``: TE's fused
``moe_permute`` on any release, and on 0.19.2 also the unfused argsort-based permute, which takes
the first ``num_out_tokens`` entries of the sorted routing map (so it picks unrouted token/expert
pairs) and the expert split fails ("split_with_sizes expects split_sizes to sum exactly to ...").
0.14-0.16's unfused permute uses ``masked_select`` and ignores the count.

For a routing map a replaying router produced, this wrapper uses the count the map really holds,
the way upstream's own token-dropping / padding branch does (``num_local_tokens_per_expert.sum()``
moved to the host at ``before_permutation_1``). Outside replay, upstream's preprocess is untouched.
Where CUDA graphs capture the preprocess (its device-to-host copies happen later, at
``before_ep_alltoall``), a dynamic count cannot be used and upstream's behaviour is kept.

Which routing maps count as replayed (the protocol a framework's own replay class meets):

- ``TopKRouter.forward`` marks the routing map it returns while the router's replay state, the
  object in its ``router_replay`` attribute, replays: its ``router_replay_action`` is
  ``"replay_forward"`` or ``"replay_backward"`` (an enum member whose ``value`` is that string, or
  the string itself). The state's class does not matter: upstream's ``RouterReplay``, patchkit's
  backport, or a framework's own class set by its own ``TopKRouter.__init__`` (verl's). The mark is
  read from that very tensor, so it is per layer and per pass.
- A routing map that did not pass through ``TopKRouter.forward`` (a framework that replaces the
  router's ``forward``) counts as replayed while any replay state in a known process-wide registry
  replays: ``global_router_replay_instances`` (upstream's and patchkit's class) or
  ``router_instances`` of the class the router module names ``RouterReplay``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

_ROUTER_MODULE = "megatron.core.transformer.moe.router"
_REPLAYING = ("replay_forward", "replay_backward")

REPLAYED_MARK = "_patchkit_replayed_routing"
"""Attribute set (to True) on a routing map that a replaying router returned."""


def is_replaying(replay_state: Any) -> bool:
    """Whether a router's replay state (any class: the protocol above) replays now; None is not."""
    action = getattr(replay_state, "router_replay_action", None)
    return getattr(action, "value", action) in _REPLAYING


def replay_in_progress() -> bool:
    """Whether any replay state in a known process-wide registry replays now.

    Reads the registry of whichever replay class the router module holds: megatron-core's and
    patchkit's keep ``global_router_replay_instances``; another framework's may keep
    ``router_instances`` (verl's DeepSeek-V4 path swaps the class in) or none. An unknown class
    counts as not replaying: the preprocess must never fail on someone else's replay state.
    """
    router_module = sys.modules.get(_ROUTER_MODULE)
    replay_cls = getattr(router_module, "RouterReplay", None)
    registry = getattr(replay_cls, "global_router_replay_instances", None)
    if registry is None:
        registry = getattr(replay_cls, "router_instances", ())
    return any(is_replaying(instance) for instance in list(registry))


def is_replayed_routing(routing_map: torch.Tensor) -> bool:
    """Whether ``routing_map`` came from a replaying router (its mark, else a known registry)."""
    return bool(getattr(routing_map, REPLAYED_MARK, False)) or replay_in_progress()


def wrap_router_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``TopKRouter.forward`` that marks the routing map it returns while its router replays."""

    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, *args, **kwargs)
        if (
            is_replaying(getattr(self, "router_replay", None))
            and isinstance(output, tuple)
            and len(output) == 2
            and isinstance(output[1], torch.Tensor)
        ):
            setattr(output[1], REPLAYED_MARK, True)
        return output

    return forward


def wrap_preprocess(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``MoEAlltoAllTokenDispatcher.preprocess`` with the replay-safe output token count."""

    @functools.wraps(original)
    def preprocess(self: Any, routing_map: torch.Tensor) -> torch.Tensor:
        tokens_per_local_expert = original(self, routing_map)
        if (
            not self.drop_and_pad
            and isinstance(self.num_out_tokens, int)  # upstream chose the static count
            and self.cuda_dtoh_point == "before_permutation_1"
            and is_replayed_routing(routing_map)
        ):
            self.num_out_tokens = routing_map.sum()
            self._maybe_update_cuda_sync_point("before_permutation_1")
        return tokens_per_local_expert

    return preprocess
