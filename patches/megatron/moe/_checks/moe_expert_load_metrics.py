"""Self-check of ``megatron.moe_expert_load_metrics``: every router logs its expert-load metrics.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import moe_replay

#: The tiny model's MoE layers (tracker slots 1-2).
_LAYERS = 2


def check_moe_expert_load_metrics(context: CheckContext) -> None:
    """After one training step every router's slot holds the std and max of the tokens its loss counted.

    A 2-layer MoE GPT with the ``aux_loss`` balancing on: the tracker must hold
    ``expert_distributed_std`` and ``max_token_per_expert`` for both routers, in the slots of their
    load-balancing loss, each equal to the std (population) and the max of the tokens per expert
    upstream's loss counted for that router.
    """
    from ..._checks._tiny_moe import build_tiny_moe, causal_batch
    from .._moe_expert_load_metrics import MAX_METRIC, STD_METRIC
    from ._expert_load_probe import AUX_LOSS_CONFIG, training_step

    with moe_replay(context.device):
        model = build_tiny_moe(**AUX_LOSS_CONFIG).to(context.device)
        step = training_step(model, causal_batch().to(context.device))
        expect(STD_METRIC in step.tracked and MAX_METRIC in step.tracked, "the tracker holds both metrics",
               [STD_METRIC, MAX_METRIC], sorted(step.tracked))
        expect(len(step.counted) == _LAYERS, "one load-balancing loss per router", _LAYERS, len(step.counted))
        counts = torch.stack([c.to(torch.float) for c in step.counted]).cpu()  # [router, expert], slot order
        for name, want in ((STD_METRIC, counts.std(dim=1, unbiased=False)), (MAX_METRIC, counts.max(dim=1).values)):
            got = step.tracked[name].float()
            expect(torch.allclose(got, want, atol=1e-5), f"{name} in each router's load-balancing slot",
                   want.tolist(), got.tolist())
