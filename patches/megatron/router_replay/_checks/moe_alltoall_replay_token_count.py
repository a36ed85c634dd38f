"""Self-check of ``megatron.moe_alltoall_replay_token_count``: replayed indices naming one expert
twice, the all-to-all dispatcher counts the rows really routed.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import replaying


def check_moe_alltoall_replay_token_count(context: CheckContext) -> None:
    """Replayed indices naming one expert twice: the all-to-all dispatcher counts the rows really routed."""
    from ..._checks._tiny_moe import TOPK, dispatchers, forward_loss

    def expert_0_topk_times(tokens: int) -> torch.Tensor:
        return torch.zeros(tokens, TOPK, dtype=torch.long)

    with replaying(context.device, expert_0_topk_times) as (model, batch):
        tokens = batch.input_ids.numel()
        try:
            loss = forward_loss(model, batch)
        except RuntimeError as exc:
            raise SelfCheckFailed("a replay that repeats an expert passes through the all-to-all dispatcher",
                                  f"a forward routing {tokens} rows per layer",
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
        counts = [int(d.num_out_tokens) for d in dispatchers(model)]
        expect(counts == [tokens] * len(counts), "the all-to-all dispatcher's num_out_tokens under a replay "
               "that repeats an expert is the rows the routing map holds", [tokens] * len(counts), counts)
        expect(bool(torch.isfinite(loss).all()), "the replayed forward's loss is finite", "finite", "non-finite")
