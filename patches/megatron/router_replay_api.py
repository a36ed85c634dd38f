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

This module imports neither torch nor megatron until a function is called. It sits among the
catalogue's declaration modules (every public module there is one) and so declares ``PATCHES``,
empty: the patches are declared in ``router_replay``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    import torch

    from ._router_replay_packing import (  # noqa: F401
        ThdLayout,
        pack,
        sequence_parallel_shard,
        thd_layout,
        unpack,
        uses_fp8_padding,
    )

PATCHES: tuple = ()

__all__ = [
    "Action", "ReplayIndexMismatchError", "ReplayTargetMissingError", "RouterReplayError",
    "RouterReplayUnavailableError", "ThdLayout", "clear", "enable", "pack", "pending_backward",
    "recorded", "reset", "routers", "sequence_parallel_shard", "set_action", "set_targets", "thd_layout",
    "unpack", "uses_fp8_padding",
]


class RouterReplayError(RuntimeError):
    """Router replay was asked for something the current model or data cannot do."""


class RouterReplayUnavailableError(RouterReplayError):
    """No MoE router of this process has replay state (not enabled, or the patch not applied)."""


class ReplayTargetMissingError(RouterReplayError):
    """A router was told to replay but has no indices queued for this pass."""


class ReplayIndexMismatchError(RouterReplayError, ValueError):
    """Replayed indices do not have one row of ``topk`` experts per token the router sees."""

    def __init__(
        self,
        *,
        layer: int,
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
    return list(_replay_class().global_router_replay_instances)


def _require_routers() -> list[Any]:
    instances = routers()
    if not instances:
        raise RouterReplayUnavailableError(
            "no MoE router has replay state: call router_replay_api.enable(config) before building "
            "the model, and on megatron-core < 0.16 apply the patch 'megatron.router_replay' "
            "(patchkit.apply_all()) before the model is built"
        )
    return instances


def set_action(action: Union[Action, str, None]) -> None:
    """Set every router's action (``None`` clears it: routers compute top-k as usual)."""
    instances = _require_routers()
    if action is None:
        for instance in instances:
            instance.clear_router_replay_action()
        return
    try:
        wanted = Action(action)
    except ValueError:
        raise RouterReplayError(
            f"unknown router replay action {action!r}; expected one of "
            f"{[a.value for a in Action]} or None"
        ) from None
    upstream_action = _replay_module().RouterReplayAction(wanted.value)
    for instance in instances:
        instance.set_router_replay_action(upstream_action)


def set_targets(per_layer: Union["torch.Tensor", Sequence["torch.Tensor"]]) -> None:
    """Give each router the indices to replay: one ``[tokens, topk]`` tensor per MoE layer.

    ``per_layer`` is a sequence in layer order, or one ``[tokens, layers, topk]`` tensor (what
    :func:`pack` returns for ``[batch, seq, layers, topk]`` input). Each call also queues the
    tensors once for ``REPLAY_BACKWARD`` (one per micro-batch whose backward recomputes).
    Indices are converted to int64, the dtype ``gather`` needs.
    """
    instances = _require_routers()
    tensors = _split_layers(per_layer)
    if len(tensors) != len(instances):
        raise RouterReplayError(
            f"set_targets got indices for {len(tensors)} MoE layers but the model has "
            f"{len(instances)} routers with replay state"
        )
    for instance, indices in zip(instances, tensors, strict=True):
        instance.set_target_indices(indices.long())


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
    _replay_class().global_router_replay_instances.clear()


_PACKING_NAMES = ("ThdLayout", "thd_layout", "pack", "unpack", "sequence_parallel_shard", "uses_fp8_padding")


def __getattr__(name: str) -> Any:
    # The packing functions need torch; import it only when one is asked for.
    if name in _PACKING_NAMES:
        from . import _router_replay_packing

        return getattr(_router_replay_packing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
