"""The replay state of one model's routers, keyed by layer, not by position in a process-wide list.

The process-wide registry (``RouterReplay.global_router_replay_instances``) holds every router ever
built with replay on: a rebuilt decoder or a temporary reference model leaves stale entries, and a
positional list of targets then drives the wrong objects (verl #7106, #7340, #7805; NeMo-RL #2590).
This module walks the model itself (one module, or the list of virtual-pipeline chunks, wrapped or
not) and keys each router:

- a decoder router by its global layer number (``TopKRouter.layer_number``, 1-based, pipeline and
  virtual-pipeline offsets included), so dense layers of a hybrid stack (``moe_layer_freq``) are
  simply absent;
- a multi-token-prediction router by ``"mtp.<depth>"``. MTP layers number their inner transformer
  layer from 1 again, so their routers carry the *backbone's* layer numbers (NeMo-RL #3903,
  Megatron-LM #7404); keyed apart, they can never receive a backbone layer's indices.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

import torch

from .._constants import Action
from .._errors import RouterReplayError
from . import _policy as policy
from ._layers import LayerKey, layer_order
from ._owner import check_ownership, process_routers, replay_class, require_routers, upstream_action

_MTP_LAYER = re.compile(r"(^|\.)mtp\.layers\.(\d+)(\.|$)")


def _chunks(model: Any) -> list[Any]:
    return list(model) if isinstance(model, (list, tuple)) else [model]


def _mtp_key(chunk: Any, name: str) -> Optional[str]:
    match = _MTP_LAYER.search(name)
    if match is None:
        return None
    prefix = name[: match.end(2)]
    mtp_layer = chunk.get_submodule(prefix)
    depth = getattr(mtp_layer, "layer_number", None)
    return f"mtp.{depth if isinstance(depth, int) else int(match.group(2)) + 1}"


def find_routers(model: Any, *, include_mtp: bool = True) -> dict[LayerKey, tuple[Any, Any]]:
    """``{key: (replay_state, router)}`` of every router of ``model`` that has replay state."""
    from megatron.core.transformer.moe.router import TopKRouter

    found: dict[LayerKey, tuple[Any, Any]] = {}
    names: dict[LayerKey, str] = {}
    for chunk in _chunks(model):
        for name, module in chunk.named_modules():
            if not isinstance(module, TopKRouter) or getattr(module, "router_replay", None) is None:
                continue
            key: Optional[LayerKey] = _mtp_key(chunk, name)
            if key is not None and not include_mtp:
                continue
            if key is None:
                key = module.layer_number
                if not isinstance(key, int):
                    raise RouterReplayError(f"router {name!r} has no layer number (set_layer_number was not called)")
            if key in found:
                raise RouterReplayError(
                    f"routers {names[key]!r} and {name!r} both claim layer {key!r}: pass the chunks of one "
                    "model (one pipeline rank's virtual-pipeline chunks)"
                )
            found[key], names[key] = (module.router_replay, module), name
    return {key: found[key] for key in sorted(found, key=layer_order)}


def exclude_mtp_routers(model: Any) -> list[LayerKey]:
    """Turn replay off for ``model``'s multi-token-prediction routers; the keys turned off.

    Each MTP router loses its replay state (``router_replay`` becomes None, which every release
    reads as "route by your own top-k": nothing recorded, nothing replayed), and the state leaves the
    process-wide registry, so the process-wide calls count the decoder's MoE layers only and
    :func:`find_routers` no longer sees the MTP routers. Rebuild the model to turn it back on.
    """
    mtp = {key: found for key, found in find_routers(model).items() if isinstance(key, str)}
    check_ownership([replay for replay, _ in mtp.values()], replay_class())
    registry = getattr(replay_class(), "global_router_replay_instances", None)
    for replay, router in mtp.values():
        replay.clear_indices()
        replay.clear_router_replay_action()
        router.router_replay = None
        if registry is not None:
            registry[:] = [instance for instance in registry if instance is not replay]
    return list(mtp)


def moe_layer_numbers(config: Any) -> list[int]:
    """The global (1-based) numbers of the decoder's MoE layers, from ``moe_layer_freq``."""
    from patchkit.runtime.probing import get_field

    num_layers = int(get_field(config, "num_layers", 0))
    freq = get_field(config, "moe_layer_freq", 1)
    if isinstance(freq, int):
        return [i + 1 for i in range(num_layers) if i % freq == 0]
    pattern = list(freq)
    if len(pattern) != num_layers:
        raise RouterReplayError(f"moe_layer_freq has {len(pattern)} entries for {num_layers} layers")
    return [i + 1 for i, is_moe in enumerate(pattern) if is_moe]


class RouterSet:
    """Replay control of a fixed set of routers' replay states, keyed by layer: the one object that
    sets actions and targets, counts what is queued, clears, and applies per-router policies.

    :class:`ModelRouters` is the set of one model's routers (keyed by global layer number); the
    functions of ``patchkit.patches.megatron.router_replay`` drive :meth:`of_process`, every router of
    the process keyed by build order, through the same methods.
    """

    def __init__(self, states: Mapping[LayerKey, Any]) -> None:
        self._states = dict(states)

    @classmethod
    def of_process(cls, *, require: bool = True) -> RouterSet:
        """Every router with replay state in this process, keyed 0, 1, ... in build order.

        ``require``: raise unless there is at least one and patchkit or megatron-core owns them.
        """
        instances = require_routers() if require else process_routers()
        return cls(dict(enumerate(instances)))

    @property
    def layers(self) -> tuple[LayerKey, ...]:
        """The router keys, in order."""
        return tuple(self._states)

    def replay_state(self, key: LayerKey) -> Any:
        return self._states[key]

    def set_action(self, action: Union[Action, str, None]) -> None:
        """Set every router's action (``None`` clears it: routers compute top-k as usual)."""
        upstream = upstream_action(action)
        for replay in self._states.values():
            if upstream is None:
                replay.clear_router_replay_action()
            else:
                replay.set_router_replay_action(upstream)

    def recorded_indices(self) -> dict[LayerKey, Optional[torch.Tensor]]:
        """``{key: [tokens, topk] or None}``: what each router recorded in its last RECORD pass."""
        return {key: replay.get_recorded_indices() for key, replay in self._states.items()}

    def assign_targets(self, prepared: Mapping[LayerKey, torch.Tensor]) -> None:
        """Hand already validated index tensors to their routers (validate all before calling this)."""
        for key, indices in prepared.items():
            self._states[key].set_target_indices(indices)

    def pending_backward(self) -> dict[LayerKey, int]:
        """How many queued targets each router still holds for ``REPLAY_BACKWARD``."""
        return {key: len(replay.replay_backward_list) for key, replay in self._states.items()}

    def clear(self) -> None:
        """Drop recorded and target indices and clear every router's action."""
        for replay in self._states.values():
            replay.clear_indices()
            replay.clear_router_replay_action()

    def set_policy(self, *, on_missing: Optional[str] = None, on_invalid: Optional[str] = None) -> None:
        """These routers' policies (see ``router_replay._policy``); None leaves one as it is."""
        for setting, value in (("on_missing", on_missing), ("on_invalid", on_invalid)):
            if value is not None:
                policy.check_policy(setting, value)
                for replay in self._states.values():
                    policy.set_router_policy(replay, setting, value)

    def fallbacks(self) -> dict[LayerKey, dict[str, int]]:
        """Per layer: replayed passes that had no target and fell back, rows that were invalid and fell back."""
        return {key: policy.fallback_counts(replay) for key, replay in self._states.items()}

    def reset_fallbacks(self) -> None:
        for replay in self._states.values():
            policy.reset_counts(replay)


class ModelRouters(RouterSet):
    """Replay control of one model's routers (see module docstring for the keys).

    Obtained from ``router_replay.for_model(model)``. Every method touches only this model's
    routers, so stale routers of other models in the process cannot interfere.
    """

    def __init__(self, model: Any, *, include_mtp: bool = True) -> None:
        self._found = find_routers(model, include_mtp=include_mtp)
        if not self._found:
            raise RouterReplayError(
                "the model has no router with replay state: call router_replay.enable(config) "
                "before building it (and apply the patches on megatron-core < 0.16)"
            )
        check_ownership([replay for replay, _ in self._found.values()], replay_class())
        for key, (replay, _) in self._found.items():
            replay._patchkit_layer = key  # names the layer in errors and warnings
        super().__init__({key: replay for key, (replay, _) in self._found.items()})
        self.config = next(iter(self._found.values()))[1].config

    def recorded(self, *, gather_sequence_parallel: bool = True) -> dict[LayerKey, torch.Tensor]:
        """``{key: [tokens, topk]}`` recorded in the last RECORD pass.

        Under sequence parallelism each router sees ``1/tp`` of the tokens; with
        ``gather_sequence_parallel`` (default) the shards are all-gathered over the tensor-parallel
        group, in rank order, so every TP rank returns the full rows (what ``unpack`` takes).
        """
        recorded = self.recorded_indices()
        missing = [key for key, indices in recorded.items() if indices is None]
        if missing:
            raise RouterReplayError(f"layers {missing} recorded nothing: set_action('record') before the forward")
        out: dict[LayerKey, torch.Tensor] = {key: indices for key, indices in recorded.items() if indices is not None}
        if gather_sequence_parallel and _sequence_parallel(self.config):
            from ._dist import gather_sequence_parallel as gather

            out = {key: gather(value) for key, value in out.items()}
        return out

    def set_targets(
        self,
        targets: Union[Mapping[LayerKey, torch.Tensor], torch.Tensor, Sequence[torch.Tensor]],
        *,
        shard_sequence_parallel: bool = True,
        allow_missing: bool = False,
    ) -> None:
        """Give this model's routers their indices; validates everything before changing any router.

        ``targets`` is one of:

        - a mapping ``{key: [tokens, topk]}``; keys of layers this model does not hold (other
          pipeline stages) are ignored, so every stage can be handed the same merged mapping;
        - one ``[tokens, L, topk]`` tensor or a sequence of ``L`` tensors, where ``L`` is this model's
          number of routers (in :attr:`layers` order), the decoder's number of MoE layers (ordinal
          among MoE layers, the rollout engines' R2 form) or ``num_layers`` (by layer index, R3 form).

        Every router of this model needs a target unless ``allow_missing`` (then the others follow
        the ``on_missing`` policy when replaying). Under sequence parallelism, full rows are cut to
        this TP rank's shard when ``shard_sequence_parallel`` (default).
        """
        by_key = self._by_key(targets)
        absent = [key for key in self._found if key not in by_key]
        if absent and not allow_missing:
            raise RouterReplayError(
                f"no target for layers {absent} of this model (it holds {list(self._found)}); pass them, "
                "or allow_missing=True"
            )
        shard = shard_sequence_parallel and _sequence_parallel(self.config)
        prepared: dict[LayerKey, torch.Tensor] = {}
        for key in self._found:
            if key not in by_key:
                continue
            indices = _check_index_tensor(by_key[key], key)
            if shard:
                from ._dist import sequence_parallel_slice

                indices = sequence_parallel_slice(indices)
            prepared[key] = indices.long()
        self.assign_targets(prepared)

    def _by_key(self, targets: Any) -> dict[LayerKey, Any]:
        if isinstance(targets, Mapping):
            return dict(targets)
        if isinstance(targets, torch.Tensor) and targets.dim() != 3:
            raise RouterReplayError(
                f"set_targets takes a mapping, a [tokens, layers, topk] tensor or a sequence of [tokens, topk] "
                f"tensors; got a tensor of shape {list(targets.shape)}"
            )
        tensors = list(targets.unbind(1)) if isinstance(targets, torch.Tensor) else list(targets)
        moe_layers = moe_layer_numbers(self.config)
        num_layers = int(self.config.num_layers)
        if len(tensors) == len(self._found):
            return dict(zip(self._found, tensors, strict=True))
        if len(tensors) == len(moe_layers):
            return dict(zip(moe_layers, tensors, strict=True))
        if len(tensors) == num_layers:
            return {number: tensors[number - 1] for number in moe_layers}
        raise RouterReplayError(
            f"got indices for {len(tensors)} layers; expected {len(self._found)} (this model's routers "
            f"{list(self._found)}), {len(moe_layers)} (MoE layers of the decoder) or {num_layers} (all layers)"
        )


def _sequence_parallel(config: Any) -> bool:
    from patchkit.runtime.probing import get_field

    return bool(get_field(config, "sequence_parallel", False)) and int(
        get_field(config, "tensor_model_parallel_size", 1)
    ) > 1


def _check_index_tensor(indices: Any, key: Any) -> torch.Tensor:
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
        shape = list(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise RouterReplayError(f"layer {key!r}: expected a [tokens, topk] index tensor; got {shape}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise RouterReplayError(f"layer {key!r}: expert indices must be integers; got {indices.dtype}")
    return indices


