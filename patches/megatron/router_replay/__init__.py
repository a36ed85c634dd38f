"""Router replay: the patches that make MoE router replay work, and one interface to drive it.

Router replay records each MoE layer's top-k expert indices in one forward and replays them in
later forwards (``REPLAY_FORWARD``) and activation recomputation (``REPLAY_BACKWARD``). From
megatron-core 0.16 upstream implements it (``moe/router_replay.py``); on 0.14 and 0.15 the
``megatron.router_replay`` patch installs the same behaviour. This package drives either, so a
framework never branches on the megatron-core version::

    from patchkit.patches.megatron import router_replay as replay

    replay.enable(config)                       # before the model is built
    replay.set_action("record"); model(...)     # rollout log-prob pass
    per_layer = replay.recorded()               # [tokens, topk] per MoE layer
    replay.set_targets(per_layer); replay.set_action("replay_forward"); model(...)
    replay.set_action("replay_backward"); loss.backward()   # recompute replays each target once

Index tensors are in the packed THD token order the model sees; :func:`pack` and :func:`unpack`
convert from and to per-sample ``[batch, seq, ...]`` tensors with the FP8 / quantization-aware
padding the model's input was built with (see ``_packing``). :func:`for_model` scopes the same
calls to one model's routers; :func:`exclude_mtp` turns replay off for a model's MTP layers.

The family's patches are declared beside this file (``router_replay``, ``router_replay_validation``,
``routing_replay_keyword``, ``moe_alltoall_replay_token_count``). The public names below are
imported from their private modules on first use (PEP 562), so importing this package, as the
catalogue does for its declarations, imports neither torch nor megatron.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._constants import Action
from .._errors import (
    PackedShapeError,
    ReplayIndexInvalidError,
    ReplayIndexMismatchError,
    ReplayTargetMissingError,
    RouterReplayConflictError,
    RouterReplayError,
    RouterReplayUnavailableError,
)

if TYPE_CHECKING:
    from ._api import (
        clear,
        enable,
        exclude_mtp,
        fallbacks,
        for_model,
        ownership,
        pending_backward,
        policy,
        recorded,
        reset,
        routers,
        set_action,
        set_policy,
        set_targets,
    )
    from ._dist import gather_pipeline, gather_sequence_parallel
    from ._layers import merge_layers, stack_layers
    from ._owner import Ownership
    from ._packing import ThdLayout, pack, sequence_parallel_shard, thd_layout, unpack, uses_fp8_padding
    from ._scope import ModelRouters, RouterSet, moe_layer_numbers

#: Imported on first use (they need torch or megatron); the errors and ``Action`` above are bound now,
#: so a caller catches them without importing either.
_EXPORTS = {
    **dict.fromkeys(("clear", "enable", "exclude_mtp", "fallbacks", "for_model", "ownership", "pending_backward",
                     "policy", "recorded", "reset", "routers", "set_action", "set_policy", "set_targets"), "._api"),
    **dict.fromkeys(("gather_pipeline", "gather_sequence_parallel"), "._dist"),
    **dict.fromkeys(("merge_layers", "stack_layers"), "._layers"),
    "Ownership": "._owner",
    **dict.fromkeys(("ThdLayout", "pack", "sequence_parallel_shard", "thd_layout", "unpack", "uses_fp8_padding"),
                    "._packing"),
    **dict.fromkeys(("ModelRouters", "RouterSet", "moe_layer_numbers"), "._scope"),
}
__all__ = [
    "Action", "ModelRouters", "Ownership", "PackedShapeError", "ReplayIndexInvalidError", "ReplayIndexMismatchError",
    "ReplayTargetMissingError", "RouterReplayConflictError", "RouterReplayError", "RouterReplayUnavailableError",
    "RouterSet", "ThdLayout", "clear", "enable", "exclude_mtp", "fallbacks", "for_model", "gather_pipeline",
    "gather_sequence_parallel", "merge_layers", "moe_layer_numbers", "ownership", "pack", "pending_backward",
    "policy", "recorded", "reset", "routers", "sequence_parallel_shard", "set_action", "set_policy", "set_targets",
    "stack_layers", "thd_layout", "unpack", "uses_fp8_padding",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
