"""``TopKRouter._apply_aux_loss`` for megatron-core 0.14-0.19: upstream's, then the expert-load metrics.

Upstream's ``_apply_aux_loss`` returns at once when the ``aux_loss`` coefficient is 0; otherwise it
counts the tokens per expert of the routing map it is given (summed over the router's ``tp_cp_group``)
and logs the load-balancing loss in the MoE tracker. When it logs, this logs the two metrics of the
same counts beside it, as ROLL's ``patch_apply_aux_loss`` does:

- ``expert_distributed_std``: ``std(tokens_per_expert, unbiased=False)``;
- ``max_token_per_expert``: ``max(tokens_per_expert)``.

The counts are recomputed here (the same sum and all-reduce over ``tp_cp_group`` upstream does
inside the method, whose result it does not return): one all-reduce of ``num_experts`` integers per
MoE layer. They go to the slot upstream logs the router's loss in: ``layer_number``, plus
``num_layers`` for an MTP layer's router on the releases that mark one (``is_mtp_layer``, 0.17+); the
entries are sized decoder + MTP layers, as upstream sizes its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region
from megatron.core.transformer.moe.moe_utils import save_to_aux_losses_tracker

#: The tracker names ROLL gives the two metrics.
STD_METRIC = "expert_distributed_std"
MAX_METRIC = "max_token_per_expert"


def _global_tokens_per_expert(router: Any, routing_map: torch.Tensor) -> torch.Tensor:
    """Tokens per expert over the router's TP x CP group, counted as upstream counts them for its loss."""
    return reduce_from_tensor_model_parallel_region(routing_map.sum(dim=0), router.tp_cp_group).detach()


def _tracker_slot(router: Any) -> tuple[int, int]:
    """(layer number, tracker size) as upstream's ``attach_and_log_load_balancing_loss`` logs the loss."""
    config = router.config
    num_layers = config.num_layers + (config.mtp_num_layers or 0)
    layer_number = router.layer_number
    if getattr(router, "is_mtp_layer", False):
        layer_number += config.num_layers
    return layer_number, num_layers


def log_expert_load(router: Any, routing_map: torch.Tensor) -> None:
    """Record ``expert_distributed_std`` and ``max_token_per_expert`` of ``routing_map`` for ``router``."""
    tokens_per_expert = _global_tokens_per_expert(router, routing_map)
    layer_number, num_layers = _tracker_slot(router)
    save_to_aux_losses_tracker(
        STD_METRIC, torch.std(tokens_per_expert.to(torch.float), unbiased=False), layer_number, num_layers
    )
    save_to_aux_losses_tracker(MAX_METRIC, torch.max(tokens_per_expert), layer_number, num_layers)


def wrap_apply_aux_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: upstream's ``_apply_aux_loss``, then the metrics when it logged its loss.

    Every release passes ``routing_map`` third (``probs, scores_for_aux_loss, routing_map``), by
    position from ``routing``; 0.16+ add ``with_padding_mask``, which changes the token count the
    loss is normalised by, not the tokens per expert.
    """

    @functools.wraps(original)
    def _apply_aux_loss(self: Any, probs: Any, scores_for_aux_loss: Any, routing_map: Any, *args: Any,
                        **kwargs: Any) -> Any:
        output = original(self, probs, scores_for_aux_loss, routing_map, *args, **kwargs)
        if self.get_aux_loss_coeff("aux_loss") != 0:  # upstream returned early, logging nothing, at 0
            log_expert_load(self, routing_map)
        return output

    return _apply_aux_loss
