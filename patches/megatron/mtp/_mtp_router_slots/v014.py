"""MTP routers' MoE-tracker slots for megatron-core 0.14-0.16.

- ``MultiTokenPredictionLayer.__init__`` (0.14-0.15): derived from 0.16's, which builds the MTP
  layer's inner transformer layer as layer ``num_layers + depth``, so its MoE router logs its
  load-balancing and z-loss after the decoder's layers. 0.14-0.15 build it as layer 1 (plus the
  pipeline offset): the MTP router's losses land in decoder layer 1's slot. What changes: after
  the original ``__init__`` the MoE layer (and so its router) is renumbered
  ``num_layers + layer_number`` through upstream's own ``set_layer_number``. Only the MoE layer: on
  0.14-0.15 a router's number serves the tracker and nothing else, while the attention's number
  also scales its softmax (``apply_query_key_layer_scaling``) and is left as upstream built it.
- ``track_moe_metrics`` (0.14-0.16): derived from 0.17's, which sizes the entries
  ``force_initialize`` creates ``num_layers + mtp_num_layers``, as routers size them. What changes:
  the missing entries are created at that size before the original runs (which then finds them),
  on the current CUDA device, or on the CPU where there is none (as 0.19's ``ensure_initialized``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker


def wrap_mtp_layer_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: renumber the MTP layer's MoE after the decoder's layers."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        moe = getattr(getattr(self, "transformer_layer", None), "mlp", None)
        if callable(getattr(moe, "set_layer_number", None)) and isinstance(self.layer_number, int):
            moe.set_layer_number(self.config.num_layers + self.layer_number)

    return __init__


def _forced_entry_size(bound: inspect.BoundArguments) -> int | None:
    arguments = bound.arguments
    if not arguments.get("force_initialize") or not arguments.get("track_names"):
        return None
    num_layers = arguments.get("num_layers")
    if not isinstance(num_layers, int):
        return None  # upstream's own error (or no entry) follows
    return num_layers + (arguments.get("mtp_num_layers") or 0)


def wrap_track_moe_metrics(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: forced tracker entries sized for the decoder and the MTP layers."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def track_moe_metrics(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # upstream's own error for a call it does not take
            return original(*args, **kwargs)
        size = _forced_entry_size(bound)
        if size is not None:
            tracker = get_moe_layer_wise_logging_tracker()
            device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
            for name in bound.arguments["track_names"]:
                if name not in tracker:
                    tracker[name] = {
                        "values": torch.zeros(size, device=device),
                        "reduce_group": None,
                        "avg_group": None,
                        "reduce_group_has_dp": False,
                    }
        return original(*args, **kwargs)

    return track_moe_metrics
