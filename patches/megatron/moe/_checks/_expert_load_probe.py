"""What ``megatron.moe_expert_load_metrics``'s self-check and tests measure: one training step of a tiny
MoE GPT, the MoE tracker afterwards, and the tokens per expert upstream counted for each load-balancing
loss (read from the counts it hands ``switch_load_balancing_loss_func``, in call order).

The process's own tracker contents are saved and put back (``_mtp_router_probe.empty_tracker``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from ...mtp._checks._mtp_router_probe import AUX_LOSS_CONFIG, empty_tracker, tracked_values

__all__ = ["AUX_LOSS_CONFIG", "Step", "training_step"]


class Step(NamedTuple):
    """A training step's tracker values by name, and upstream's tokens per expert for each loss it logged."""

    tracked: dict[str, torch.Tensor]
    counted: list[torch.Tensor]


@contextlib.contextmanager
def _counts_upstream_balances(counted: list[torch.Tensor]) -> Iterator[None]:
    """Record the ``tokens_per_expert`` each router hands upstream's load-balancing loss."""
    from megatron.core.transformer.moe import router

    original = router.switch_load_balancing_loss_func

    def recording(*args: Any, **kwargs: Any) -> Any:
        counted.append(kwargs["tokens_per_expert"].detach().clone())
        return original(*args, **kwargs)

    router.switch_load_balancing_loss_func = recording
    try:
        yield
    finally:
        router.switch_load_balancing_loss_func = original


def training_step(model: Any, batch: Any) -> Step:
    """One training forward/backward of ``model``; what the tracker and upstream's loss saw."""
    from ..._checks._tiny_moe import forward_loss

    model.train()
    counted: list[torch.Tensor] = []
    with empty_tracker(), _counts_upstream_balances(counted):
        forward_loss(model, batch).sum().backward()
        return Step(tracked_values(), counted)
