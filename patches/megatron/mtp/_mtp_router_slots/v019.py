"""``Router.set_layer_number`` for megatron-core 0.19: an MTP router's replay state numbered apart.

Derived from 0.19's ``Router.set_layer_number``, which stores the number on the router and on its
``RouterReplay`` (``router_replay.layer_number``, new in 0.19). An MTP layer numbers its inner
layer from 1 again, so an MTP router's replay state carries a backbone layer's number; a framework
that keys replay data by it hands decoder layer k's routes to MTP depth k (NeMo-RL #3903). What
changes: for a router built with ``is_mtp_layer`` the replay state gets ``layer_number +
num_layers``, the slot 0.19 itself logs that router's aux losses at; the router's own
``layer_number`` stays upstream's (its loss logging adds ``num_layers`` itself).
"""

from __future__ import annotations

import functools
from typing import Any, Callable


def wrap_set_layer_number(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: number an MTP router's replay state after the decoder's layers."""

    @functools.wraps(original)
    def set_layer_number(self: Any, layer_number: int) -> None:
        original(self, layer_number)
        replay = getattr(self, "router_replay", None)
        if replay is not None and getattr(self, "is_mtp_layer", False) and isinstance(layer_number, int):
            replay.layer_number = layer_number + self.config.num_layers

    return set_layer_number
