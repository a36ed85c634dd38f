"""One interface to MoE router replay, whichever megatron-core provides it.

Router replay records each MoE layer's top-k expert indices in one forward and replays them in
later forwards (``REPLAY_FORWARD``) and activation recomputation (``REPLAY_BACKWARD``). From
megatron-core 0.16 upstream implements it (``moe/router_replay.py``); on 0.14 and 0.15 the
``megatron.router_replay`` patch installs the same behaviour. This module drives either, so a
framework never branches on the megatron-core version::

    from patchkit.patches.megatron import router_replay_api as replay

    replay.enable(config)                       # before the model is built
    replay.set_action("record"); model(...)     # rollout log-prob pass
    per_layer = replay.recorded()               # [tokens, topk] per MoE layer
    replay.set_targets(per_layer); replay.set_action("replay_forward"); model(...)
    replay.set_action("replay_backward"); loss.backward()   # recompute replays each target once

Index tensors are in the packed THD token order the model sees; :func:`pack` and :func:`unpack`
convert from and to per-sample ``[batch, seq, ...]`` tensors with the FP8 / quantization-aware
padding the model's input was built with (see ``_router_replay_packing``).

Every function here drives one :class:`~patchkit.patches.megatron._router_replay_scope.RouterSet`:
the process's routers in build order (:meth:`RouterSet.of_process`), or one model's routers keyed by
layer number (:func:`for_model`, a ``ModelRouters``). This module imports neither torch nor megatron
until a function is called. It declares no patch (they are declared in ``router_replay`` and its
siblings), so the catalogue does not load it at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from ._constants import Action
from ._errors import (
    PackedShapeError,
    ReplayIndexInvalidError,
    ReplayIndexMismatchError,
    ReplayTargetMissingError,
    RouterReplayConflictError,
    RouterReplayError,
    RouterReplayUnavailableError,
)
from ._router_replay_owner import Ownership, ownership_of, process_routers, replay_class

# The names this module had before the owner module existed (tests and callers reach for them).
from ._router_replay_owner import check_ownership as _check_ownership  # noqa: F401
from ._router_replay_owner import foreign_signs as _foreign_signs  # noqa: F401
from ._router_replay_owner import replay_class as _replay_class  # noqa: F401
from ._router_replay_owner import replay_module as _replay_module  # noqa: F401
from ._router_replay_owner import require_routers as _require_routers  # noqa: F401
from ._router_replay_owner import upstream_action as _upstream_action  # noqa: F401

if TYPE_CHECKING:
    import torch

    from ._router_replay_dist import gather_pipeline, gather_sequence_parallel  # noqa: F401
    from ._router_replay_layers import merge_layers, stack_layers  # noqa: F401
    from ._router_replay_packing import (  # noqa: F401
        ThdLayout,
        pack,
        sequence_parallel_shard,
        thd_layout,
        unpack,
        uses_fp8_padding,
    )
    from ._router_replay_scope import ModelRouters, RouterSet, moe_layer_numbers  # noqa: F401

__all__ = [
    "Action", "ModelRouters", "Ownership", "PackedShapeError", "ReplayIndexInvalidError", "ReplayIndexMismatchError",
    "ReplayTargetMissingError", "RouterReplayConflictError", "RouterReplayError", "RouterReplayUnavailableError",
    "RouterSet", "ThdLayout", "clear", "enable", "fallbacks", "for_model", "gather_pipeline",
    "gather_sequence_parallel", "merge_layers", "moe_layer_numbers", "ownership", "pack", "pending_backward",
    "policy", "recorded", "reset", "routers", "sequence_parallel_shard", "set_action", "set_policy", "set_targets",
    "stack_layers", "thd_layout", "unpack", "uses_fp8_padding",
]


def _process(*, require: bool = True) -> RouterSet:
    from ._router_replay_scope import RouterSet

    return RouterSet.of_process(require=require)


def enable(config: Any) -> None:
    """Turn replay on for models built from ``config`` from now on (any megatron-core release).

    Sets ``moe_enable_routing_replay``; on 0.14/0.15, where ``TransformerConfig`` lacks the field,
    it is added to this config object, and the ``megatron.router_replay`` patch reads it.
    """
    config.moe_enable_routing_replay = True


def routers() -> list[Any]:
    """Every MoE layer's replay state in this process, in the order the layers were built."""
    return process_routers()


def ownership(model: Any = None) -> Ownership:
    """Whether patchkit's replay, megatron-core's or another framework's drives the routers.

    A framework that installs its own replay patch (verl's ``patched_init`` replaces
    ``self.router_replay`` with its own class; its DeepSeek-V4 path swaps the router module's
    ``RouterReplay`` for a class with ``router_instances``) owns the routers: patchkit's checks and
    dispatcher count stand aside, and this API refuses to drive routers it does not own
    (:class:`RouterReplayConflictError`) instead of setting actions on objects nothing reads.
    """
    if model is not None:
        from ._router_replay_scope import find_routers

        return ownership_of([replay for replay, _ in find_routers(model).values()])
    return ownership_of(process_routers())


def set_action(action: Union[Action, str, None]) -> None:
    """Set every router's action (``None`` clears it: routers compute top-k as usual)."""
    _process().set_action(action)


def set_targets(per_layer: Union["torch.Tensor", Sequence["torch.Tensor"]]) -> None:
    """Give each router the indices to replay: one ``[tokens, topk]`` tensor per MoE layer.

    ``per_layer`` is a sequence in layer order, or one ``[tokens, layers, topk]`` tensor (what
    :func:`pack` returns for ``[batch, seq, layers, topk]`` input). Each call also queues the
    tensors once for ``REPLAY_BACKWARD`` (one per micro-batch whose backward recomputes).
    Indices are converted to int64, the dtype ``gather`` needs. Every tensor is checked before
    any router changes, so a bad entry leaves all routers as they were.
    """
    process = _process()
    tensors = _split_layers(per_layer)
    if len(tensors) != len(process.layers):
        raise RouterReplayError(
            f"set_targets got indices for {len(tensors)} MoE layers but the model has "
            f"{len(process.layers)} routers with replay state"
        )
    from ._router_replay_scope import _check_index_tensor

    process.assign_targets({layer: _check_index_tensor(indices, layer).long() for layer, indices in enumerate(tensors)})


def _split_layers(per_layer: Any) -> list[Any]:
    if hasattr(per_layer, "dim"):
        if per_layer.dim() != 3:
            raise RouterReplayError(
                f"set_targets takes one [tokens, layers, topk] tensor or a sequence of "
                f"[tokens, topk] tensors; got a tensor of shape {list(per_layer.shape)}"
            )
        return list(per_layer.unbind(1))
    return list(per_layer)


def recorded() -> list[Optional["torch.Tensor"]]:
    """The indices each router recorded in its last ``RECORD`` pass (None where it did not)."""
    return list(_process().recorded_indices().values())


def pending_backward() -> list[int]:
    """How many queued targets each router still holds for ``REPLAY_BACKWARD``."""
    return list(_process().pending_backward().values())


def clear() -> None:
    """Drop recorded and target indices and clear every router's action."""
    _process(require=False).clear()


def reset() -> None:
    """Forget every router's replay state (the routers of models no longer in use)."""
    clear()
    registry = getattr(replay_class(), "global_router_replay_instances", None)
    if registry is not None:
        registry.clear()


def set_policy(*, on_missing: Optional[str] = None, on_invalid: Optional[str] = None) -> None:
    """Process-wide defaults for a missing target / invalid rows: ``"raise"`` (default) or ``"native"``.

    Needs the ``megatron.router_replay_validation`` patch (it applies them). A model's own policy
    (``for_model(model).set_policy``) takes precedence. See ``_router_replay_policy``.
    """
    from . import _router_replay_policy as _policy

    for setting, value in (("on_missing", on_missing), ("on_invalid", on_invalid)):
        if value is not None:
            _policy.DEFAULTS[setting] = _policy.check_policy(setting, value)


def policy() -> dict[str, str]:
    """The process-wide defaults set by :func:`set_policy`."""
    from . import _router_replay_policy as _policy

    return dict(_policy.DEFAULTS)


def fallbacks() -> list[dict[str, int]]:
    """Per router (process order): replayed passes without a target, and invalid rows, that fell back."""
    return list(_process(require=False).fallbacks().values())


def for_model(model: Any, *, include_mtp: bool = True) -> "ModelRouters":
    """Replay control of ``model``'s routers only (a module or its list of virtual-pipeline chunks).

    Routers are keyed by global layer number (MTP routers by ``"mtp.<depth>"``); see
    :class:`~patchkit.patches.megatron._router_replay_scope.ModelRouters`.
    """
    from ._router_replay_scope import ModelRouters

    return ModelRouters(model, include_mtp=include_mtp)


_LAZY = {
    "_router_replay_packing": (
        "ThdLayout", "thd_layout", "pack", "unpack", "sequence_parallel_shard", "uses_fp8_padding",
    ),
    "_router_replay_scope": ("ModelRouters", "RouterSet", "moe_layer_numbers"),
    "_router_replay_layers": ("merge_layers", "stack_layers"),
    "_router_replay_dist": ("gather_pipeline", "gather_sequence_parallel"),
}


def __getattr__(name: str) -> Any:
    # These need torch (and megatron); import them only when one is asked for.
    for module_name, names in _LAZY.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f".{module_name}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
