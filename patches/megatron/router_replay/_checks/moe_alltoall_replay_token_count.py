"""Self-check of ``megatron.moe_alltoall_replay_token_count``: replayed indices naming one expert
twice, the all-to-all dispatcher counts the rows really routed, whether upstream's replay class or
a framework's own class holds the routers' replay state.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import replaying
from ._framework_router import framework_replaying


def check_moe_alltoall_replay_token_count(context: CheckContext) -> None:
    """Replayed indices naming one expert twice: the all-to-all dispatcher counts the rows really routed."""
    from ..._checks._tiny_moe import TOPK

    def expert_0_topk_times(tokens: int) -> torch.Tensor:
        return torch.zeros(tokens, TOPK, dtype=torch.long)

    drivers = (("upstream's replay class", replaying), ("a framework's own replay class", framework_replaying))
    for holder, driver in drivers:
        with driver(context.device, expert_0_topk_times) as (model, batch):
            _expect_exact_count(model, batch, holder)


def _expect_exact_count(model: Any, batch: Any, holder: str) -> None:
    from ..._checks._tiny_moe import dispatchers, forward_loss

    tokens = batch.input_ids.numel()
    try:
        loss = forward_loss(model, batch)
    except RuntimeError as exc:
        raise SelfCheckFailed(f"a replay that repeats an expert ({holder}) passes through the all-to-all "
                              "dispatcher", f"a forward routing {tokens} rows per layer",
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
    counts = [int(d.num_out_tokens) for d in dispatchers(model)]
    expect(counts == [tokens] * len(counts), f"the all-to-all dispatcher's num_out_tokens under a replay that "
           f"repeats an expert ({holder}) is the rows the routing map holds", [tokens] * len(counts), counts)
    expect(bool(torch.isfinite(loss).all()), f"the replayed forward's loss ({holder}) is finite", "finite",
           "non-finite")
