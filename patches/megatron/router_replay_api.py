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

This module imports neither torch nor megatron until a function is called. It declares no patch
(they are declared in ``router_replay``), so the catalogue does not load it at start-up.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Union

if TYPE_CHECKING:
    import torch

    from ._router_replay_dist import gather_pipeline, gather_sequence_parallel  # noqa: F401
    from ._router_replay_packing import (  # noqa: F401
        ThdLayout,
        pack,
        sequence_parallel_shard,
        thd_layout,
        unpack,
        uses_fp8_padding,
    )
    from ._router_replay_scope import ModelRouters, merge_layers, moe_layer_numbers, stack_layers  # noqa: F401

__all__ = [
    "Action", "ModelRouters", "Ownership", "PackedShapeError", "ReplayIndexInvalidError", "ReplayIndexMismatchError",
    "ReplayTargetMissingError", "RouterReplayConflictError", "RouterReplayError", "RouterReplayUnavailableError",
    "ThdLayout", "clear", "enable", "fallbacks", "for_model", "gather_pipeline", "gather_sequence_parallel",
    "merge_layers", "moe_layer_numbers", "ownership", "pack", "pending_backward", "policy", "recorded", "reset",
    "routers", "sequence_parallel_shard", "set_action", "set_policy", "set_targets", "stack_layers", "thd_layout",
    "unpack", "uses_fp8_padding",
]


class RouterReplayError(RuntimeError):
    """Router replay was asked for something the current model or data cannot do."""


class PackedShapeError(RouterReplayError, ValueError):
    """A packed index tensor whose shape does not fit the :class:`ThdLayout` it is used with."""


class RouterReplayUnavailableError(RouterReplayError):
    """No MoE router of this process has replay state (not enabled, or the patch not applied)."""


class ReplayTargetMissingError(RouterReplayError):
    """A router was told to replay but has no indices queued for this pass."""


class RouterReplayConflictError(RouterReplayError):
    """Another framework's replay patch owns the routers; patchkit's API stands aside."""


class ReplayIndexInvalidError(RouterReplayError, ValueError):
    """Replayed rows hold expert indices outside ``[0, num_experts)`` (e.g. the ``-1`` sentinel)."""

    def __init__(
        self, *, layer: Any, rows: int, tokens: int, num_experts: int, action: str = "", example: Any = None
    ) -> None:
        self.layer = layer
        self.rows = rows
        self.tokens = tokens
        self.num_experts = num_experts
        super().__init__(
            f"MoE layer {layer}" + (f" ({action})" if action else "") + f": {rows} of {tokens} replayed rows "
            f"hold expert indices outside [0, {num_experts}) (first such row: {example}); rollout engines "
            "write -1 for tokens they have no routing for. Fix the rows, or set_policy(on_invalid='native') "
            "to let the router choose for them"
        )


class ReplayIndexMismatchError(RouterReplayError, ValueError):
    """Replayed indices do not have one row of ``topk`` experts per token the router sees."""

    def __init__(
        self,
        *,
        layer: Any,
        expected_tokens: int,
        got_tokens: int,
        topk: Optional[int] = None,
        got_shape: tuple[int, ...] = (),
        action: str = "",
    ) -> None:
        self.layer = layer
        self.expected_tokens = expected_tokens
        self.got_tokens = got_tokens
        self.topk = topk
        self.got_shape = got_shape
        where = f"MoE layer {layer}" + (f" ({action})" if action else "")
        shape = f" [{expected_tokens}, {topk}]" if topk is not None else ""
        super().__init__(
            f"{where}: the router sees {expected_tokens} tokens but the replay target has "
            f"{got_tokens} (shape {list(got_shape)}, expected{shape}); pack the per-sample "
            "indices with the same THD padding (FP8 / TP / CP alignment) as the model input"
        )


class Action(str, enum.Enum):
    """What every router does with its top-k selection in the next passes."""

    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"


def _replay_module() -> Any:
    """Upstream's ``router_replay`` module where megatron-core has it (0.16+), else the backport.

    Both define ``RouterReplay`` and ``RouterReplayAction`` with the same names and values.
    """
    try:
        from megatron.core.transformer.moe import router_replay
    except ImportError:
        from . import _router_replay_backport as router_replay
    return router_replay


def _replay_class() -> Any:
    return _replay_module().RouterReplay


def enable(config: Any) -> None:
    """Turn replay on for models built from ``config`` from now on (any megatron-core release).

    Sets ``moe_enable_routing_replay``; on 0.14/0.15, where ``TransformerConfig`` lacks the field,
    it is added to this config object, and the ``megatron.router_replay`` patch reads it.
    """
    config.moe_enable_routing_replay = True


def routers() -> list[Any]:
    """Every MoE layer's replay state in this process, in the order the layers were built."""
    return list(getattr(_replay_class(), "global_router_replay_instances", ()))


class Ownership(NamedTuple):
    """Who drives router replay in this process (see :func:`ownership`)."""

    owner: str
    """``"patchkit"`` (the 0.14/0.15 backport), ``"megatron-core"`` (native), ``"foreign"`` (another
    framework's patch: patchkit stands aside), or ``"none"`` (no router with replay state)."""
    detail: str


def _foreign_signs(instances: Sequence[Any], expected: Any) -> list[str]:
    signs = []
    router_module = sys.modules.get("megatron.core.transformer.moe.router")
    module_cls = getattr(router_module, "RouterReplay", None)
    if module_cls is not None and not hasattr(module_cls, "global_router_replay_instances"):
        signs.append(
            f"megatron.core.transformer.moe.router.RouterReplay is {module_cls.__module__}.{module_cls.__qualname__}, "
            "which keeps no global_router_replay_instances"
        )
    topk_router = getattr(router_module, "TopKRouter", None)
    if topk_router is not None and getattr(topk_router, "_router_replay_patched", False):
        signs.append("TopKRouter carries another framework's replay patch (_router_replay_patched)")
    strangers = {type(r) for r in instances if not isinstance(r, expected)}
    for cls in sorted(strangers, key=lambda c: c.__qualname__):
        signs.append(f"routers hold replay state of class {cls.__module__}.{cls.__qualname__}")
    return signs


def ownership(model: Any = None) -> Ownership:
    """Whether patchkit's replay, megatron-core's or another framework's drives the routers.

    A framework that installs its own replay patch (verl's ``patched_init`` replaces
    ``self.router_replay`` with its own class; its DeepSeek-V4 path swaps the router module's
    ``RouterReplay`` for a class with ``router_instances``) owns the routers: patchkit's checks and
    dispatcher count stand aside, and this API refuses to drive routers it does not own
    (:class:`RouterReplayConflictError`) instead of setting actions on objects nothing reads.
    """
    expected = _replay_class()
    if model is not None:
        from ._router_replay_scope import find_routers

        instances = [replay for replay, _ in find_routers(model).values()]
    else:
        instances = _live_router_states()
    signs = _foreign_signs(instances, expected)
    if signs:
        return Ownership("foreign", "; ".join(signs))
    if not instances:
        return Ownership("none", "no MoE router with replay state")
    native = expected.__module__.startswith("megatron.")
    return Ownership("megatron-core" if native else "patchkit", f"{len(instances)} routers, {expected.__qualname__}")


def _live_router_states() -> list[Any]:
    return routers()


def _check_ownership(instances: Sequence[Any], expected: Any) -> None:
    signs = _foreign_signs(instances, expected)
    if signs:
        raise RouterReplayConflictError(
            "another framework's router replay patch owns the routers (" + "; ".join(signs) + "); patchkit "
            "stands aside: drive replay through that framework, or do not install its patch"
        )


def _require_routers() -> list[Any]:
    instances = routers()
    if not instances:
        _check_ownership([], _replay_class())
        raise RouterReplayUnavailableError(
            "no MoE router has replay state: call router_replay_api.enable(config) before building "
            "the model, and on megatron-core < 0.16 apply the patch 'megatron.router_replay' "
            "(patchkit.apply_all()) before the model is built"
        )
    _check_ownership(instances, _replay_class())
    return instances


def _upstream_action(action: Union[Action, str, None]) -> Any:
    if action is None:
        return None
    try:
        wanted = Action(action)
    except ValueError:
        raise RouterReplayError(
            f"unknown router replay action {action!r}; expected one of "
            f"{[a.value for a in Action]} or None"
        ) from None
    return _replay_module().RouterReplayAction(wanted.value)


def set_action(action: Union[Action, str, None]) -> None:
    """Set every router's action (``None`` clears it: routers compute top-k as usual)."""
    instances = _require_routers()
    upstream_action = _upstream_action(action)
    for instance in instances:
        if upstream_action is None:
            instance.clear_router_replay_action()
        else:
            instance.set_router_replay_action(upstream_action)


def set_targets(per_layer: Union["torch.Tensor", Sequence["torch.Tensor"]]) -> None:
    """Give each router the indices to replay: one ``[tokens, topk]`` tensor per MoE layer.

    ``per_layer`` is a sequence in layer order, or one ``[tokens, layers, topk]`` tensor (what
    :func:`pack` returns for ``[batch, seq, layers, topk]`` input). Each call also queues the
    tensors once for ``REPLAY_BACKWARD`` (one per micro-batch whose backward recomputes).
    Indices are converted to int64, the dtype ``gather`` needs. Every tensor is checked before
    any router changes, so a bad entry leaves all routers as they were.
    """
    instances = _require_routers()
    tensors = _split_layers(per_layer)
    if len(tensors) != len(instances):
        raise RouterReplayError(
            f"set_targets got indices for {len(tensors)} MoE layers but the model has "
            f"{len(instances)} routers with replay state"
        )
    from ._router_replay_scope import _check_index_tensor

    prepared = [_check_index_tensor(indices, layer).long() for layer, indices in enumerate(tensors)]
    for instance, indices in zip(instances, prepared, strict=True):
        instance.set_target_indices(indices)


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
    return [instance.get_recorded_indices() for instance in _require_routers()]


def pending_backward() -> list[int]:
    """How many queued targets each router still holds for ``REPLAY_BACKWARD``."""
    return [len(instance.replay_backward_list) for instance in _require_routers()]


def clear() -> None:
    """Drop recorded and target indices and clear every router's action."""
    for instance in routers():
        instance.clear_indices()
        instance.clear_router_replay_action()


def reset() -> None:
    """Forget every router's replay state (the routers of models no longer in use)."""
    clear()
    registry = getattr(_replay_class(), "global_router_replay_instances", None)
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
    from . import _router_replay_policy as _policy

    return [_policy.fallback_counts(instance) for instance in routers()]


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
    "_router_replay_scope": ("ModelRouters", "merge_layers", "stack_layers", "moe_layer_numbers"),
    "_router_replay_dist": ("gather_pipeline", "gather_sequence_parallel"),
}


def __getattr__(name: str) -> Any:
    # These need torch (and megatron); import them only when one is asked for.
    for module_name, names in _LAZY.items():
        if name in names:
            import importlib

            return getattr(importlib.import_module(f".{module_name}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
