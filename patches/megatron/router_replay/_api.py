"""The router replay functions of the public API (``patchkit.patches.megatron.router_replay``).

Every function here drives one :class:`~patchkit.patches.megatron.router_replay._scope.RouterSet`:
the process's routers in build order (:meth:`RouterSet.of_process`), or one model's routers keyed by
layer number (:func:`for_model`, a ``ModelRouters``). This module imports neither torch nor megatron
until a function is called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

from .._constants import Action
from .._errors import RouterReplayError
from ._owner import Ownership, ownership_of, process_routers, replay_class

if TYPE_CHECKING:
    import torch

    from ._scope import ModelRouters, RouterSet


def _process(*, require: bool = True) -> RouterSet:
    from ._scope import RouterSet

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
        from ._scope import find_routers

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
    from ._scope import _check_index_tensor

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
    (``for_model(model).set_policy``) takes precedence. See ``router_replay._policy``.
    """
    from . import _policy

    for setting, value in (("on_missing", on_missing), ("on_invalid", on_invalid)):
        if value is not None:
            _policy.DEFAULTS[setting] = _policy.check_policy(setting, value)


def policy() -> dict[str, str]:
    """The process-wide defaults set by :func:`set_policy`."""
    from . import _policy

    return dict(_policy.DEFAULTS)


def fallbacks() -> list[dict[str, int]]:
    """Per router (process order): replayed passes without a target, and invalid rows, that fell back."""
    return list(_process(require=False).fallbacks().values())


def exclude_mtp(model: Any) -> list[Any]:
    """Turn router replay off for ``model``'s multi-token-prediction layers (opt-in; call once, after
    building the model and before the first recorded pass); returns the keys turned off
    (``["mtp.1", ...]``).

    Their routers then route by their own top-k in every pass and record nothing; the process-wide
    functions and :func:`for_model` see the decoder's routers only, so per-layer targets are the
    decoder's MoE layers on every release. On megatron-core 0.19 an MTP router carries the number of
    a backbone layer, so a layer-numbered target could otherwise land on it. Where the rollout
    engine records no routing for MTP layers, this is the switch. Rebuild the model to turn it back on.
    """
    from ._scope import exclude_mtp_routers

    return exclude_mtp_routers(model)


def for_model(model: Any, *, include_mtp: bool = True) -> "ModelRouters":
    """Replay control of ``model``'s routers only (a module or its list of virtual-pipeline chunks).

    Routers are keyed by global layer number (MTP routers by ``"mtp.<depth>"``); see
    :class:`~patchkit.patches.megatron.router_replay._scope.ModelRouters`.
    """
    from ._scope import ModelRouters

    return ModelRouters(model, include_mtp=include_mtp)
