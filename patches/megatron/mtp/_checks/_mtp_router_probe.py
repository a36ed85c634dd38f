"""What ``megatron.mtp_router_slots``'s self-check and tests measure on a tiny MoE GPT with MTP.

- :func:`logged_layer_losses`: one training forward/backward with the load-balancing and z-loss on,
  and the per-layer values the MoE tracker holds afterwards (0.14-0.18's layer-wise dict, 0.19's
  ``MoEMetricsTracker``), the tracker emptied before and after.
- :func:`forced_entry_sizes`: ``track_moe_metrics(force_initialize=True)`` on an empty tracker (a
  pipeline rank whose layers are all dense), and the sizes of the entries it creates.
- :func:`replay_layer_numbers`: each router's replay-state ``layer_number`` (0.19+), by module name.

The process's own tracker contents are saved and put back, so a check leaves no trace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

TRACKED = ("load_balancing_loss", "z_loss")
#: Config for a tiny MoE with both router losses on.
AUX_LOSS_CONFIG: dict[str, Any] = {
    "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001,
}


def _metrics_tracker() -> Any:
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker
    except ImportError:  # 0.14-0.18: a dict of dicts
        return None
    return get_moe_metrics_tracker()


@contextlib.contextmanager
def empty_tracker() -> Iterator[None]:
    """The MoE tracker and the MTP loss tracker empty inside the block; their entries restored after."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    saved_mtp = dict(MTPLossLoggingHelper.tracker)
    MTPLossLoggingHelper.tracker.clear()
    try:
        with _empty_moe_tracker():
            yield
    finally:
        MTPLossLoggingHelper.tracker.clear()
        MTPLossLoggingHelper.tracker.update(saved_mtp)


@contextlib.contextmanager
def _empty_moe_tracker() -> Iterator[None]:
    new_style = _metrics_tracker()
    if new_style is not None:
        saved = dict(new_style._metrics)
        new_style._metrics.clear()
        try:
            yield
        finally:
            new_style._metrics.clear()
            new_style._metrics.update(saved)
        return
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    tracker = get_moe_layer_wise_logging_tracker()
    saved = dict(tracker)
    tracker.clear()
    try:
        yield
    finally:
        tracker.clear()
        tracker.update(saved)


def tracked_values() -> dict[str, torch.Tensor]:
    new_style = _metrics_tracker()
    if new_style is not None:
        return {name: entry.values.detach().cpu().clone() for name, entry in new_style._metrics.items()}
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    tracker = get_moe_layer_wise_logging_tracker()
    return {name: entry["values"].detach().cpu().clone() for name, entry in tracker.items()}


def logged_layer_losses(model: Any, batch: Any) -> dict[str, torch.Tensor]:
    """Per-layer tracker values after one training forward/backward of ``model``."""
    from ..._checks._tiny_moe import forward_loss

    model.train()
    with empty_tracker():
        forward_loss(model, batch).sum().backward()
        return {name: values for name, values in tracked_values().items() if name in TRACKED}


def forced_entry_sizes(num_layers: int, mtp_num_layers: int) -> dict[str, int]:
    """Sizes of the entries ``track_moe_metrics(force_initialize=True)`` creates on an empty tracker."""
    from megatron.core.transformer.moe import moe_utils

    with empty_tracker():
        moe_utils.track_moe_metrics(
            loss_scale=1.0, iteration=1, writer=None, force_initialize=True, track_names=list(TRACKED),
            num_layers=num_layers, moe_layer_freq=1, mtp_num_layers=mtp_num_layers,
        )
        return {name: int(values.numel()) for name, values in tracked_values().items()}


def replay_layer_numbers(model: Any) -> dict[str, Any]:
    """``{router module name: router_replay.layer_number}`` where the replay state has the field."""
    from megatron.core.transformer.moe.router import TopKRouter

    return {
        name: module.router_replay.layer_number
        for name, module in model.named_modules()
        if isinstance(module, TopKRouter) and hasattr(getattr(module, "router_replay", None), "layer_number")
    }
