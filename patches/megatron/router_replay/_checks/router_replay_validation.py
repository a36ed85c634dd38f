"""Self-check of ``megatron.router_replay_validation``: A replay target with the wrong token count raises
``ReplayIndexMismatchError`` naming both counts.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import replaying


def check_router_replay_validation(context: CheckContext) -> None:
    """A replay target with the wrong token count raises ``ReplayIndexMismatchError`` naming both counts."""
    from ..._checks._tiny_moe import TOPK, forward_loss
    from .. import ReplayIndexMismatchError

    def sixteen_rows_too_many(tokens: int) -> torch.Tensor:
        # What a target packed with FP8 padding for an unpadded input looks like.
        wrong = torch.zeros(tokens + 16, TOPK, dtype=torch.long)
        wrong[:, 1] = 1
        return wrong

    with replaying(context.device, sixteen_rows_too_many) as (model, batch):
        tokens = batch.input_ids.numel()
        try:
            forward_loss(model, batch)
        except ReplayIndexMismatchError as exc:
            expect(exc.expected_tokens == tokens and exc.got_tokens == tokens + 16,
                   "ReplayIndexMismatchError names the router's and the target's token counts",
                   f"{tokens} and {tokens + 16}", f"{exc.expected_tokens} and {exc.got_tokens}")
        except Exception as exc:  # upstream's own failure deep in gather, or anything else
            raise SelfCheckFailed("a replay target with the wrong token count raises", "ReplayIndexMismatchError",
                                  f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}") from exc
        else:
            raise SelfCheckFailed("a replay target with the wrong token count raises", "ReplayIndexMismatchError",
                                  "no error: the forward ran")

