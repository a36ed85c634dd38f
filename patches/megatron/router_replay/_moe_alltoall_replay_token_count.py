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

While any router is replaying, this wrapper uses the count the routing map really holds, the way
upstream's own token-dropping / padding branch does (``num_local_tokens_per_expert.sum()`` moved
to the host at ``before_permutation_1``). Outside replay, upstream's preprocess is untouched.
Where CUDA graphs capture the preprocess (its device-to-host copies happen later, at
``before_ep_alltoall``), a dynamic count cannot be used and upstream's behaviour is kept.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

_ROUTER_MODULE = "megatron.core.transformer.moe.router"
_REPLAYING = ("replay_forward", "replay_backward")


def replay_in_progress() -> bool:
    """Whether any MoE router of this process is replaying indices now.

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
    return any(
        getattr(getattr(instance, "router_replay_action", None), "value", None) in _REPLAYING
        for instance in list(registry)
    )


def wrap_preprocess(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``MoEAlltoAllTokenDispatcher.preprocess`` with the replay-safe output token count."""

    @functools.wraps(original)
    def preprocess(self: Any, routing_map: torch.Tensor) -> torch.Tensor:
        tokens_per_local_expert = original(self, routing_map)
        if (
            not self.drop_and_pad
            and isinstance(self.num_out_tokens, int)  # upstream chose the static count
            and self.cuda_dtoh_point == "before_permutation_1"
            and replay_in_progress()
        ):
            self.num_out_tokens = routing_map.sum()
            self._maybe_update_cuda_sync_point("before_permutation_1")
        return tokens_per_local_expert

    return preprocess
