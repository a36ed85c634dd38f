"""What several Megatron self-checks share: Megatron's parallel state on the check's device, and
driving a tiny model's routers through ``patchkit.patches.megatron.router_replay``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from patchkit.selfcheck import expect


@contextlib.contextmanager
def megatron_on(device: str) -> Iterator[None]:
    """Megatron parallel state (TP=PP=CP=1) on a one-rank group, on ``device``."""
    from megatron.core import parallel_state

    from ._cpu_stand_in import cpu_megatron, destroy_parallel_state, initialize_parallel_state

    with cpu_megatron() if device == "cpu" else contextlib.nullcontext():
        started = not parallel_state.model_parallel_is_initialized()
        if started:
            if device == "cuda" and not torch.distributed.is_initialized():
                start_nccl_group()
            initialize_parallel_state()
        try:
            yield
        finally:
            if started:
                destroy_parallel_state()


def start_nccl_group() -> None:
    torch.cuda.set_device(0)
    # A group of one on an in-memory store: no port to pick first and lose to another process.
    torch.distributed.init_process_group(backend="nccl", store=torch.distributed.HashStore(), rank=0, world_size=1)


def forward(model: Any, batch: Any, labels: bool = True) -> torch.Tensor:
    return model(batch.input_ids, batch.position_ids, batch.attention_mask,
                 labels=batch.labels if labels else None, loss_mask=batch.loss_mask)


def first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


@contextlib.contextmanager
def moe_replay(device: str) -> Iterator[None]:
    """Megatron on ``device`` with the MoE stand-ins on CPU; replay state of other models left as it was.

    The routers a check builds register in upstream's process-wide list; they are removed again, and
    the routers that were there before keep their actions and targets.
    """
    from ..router_replay._owner import replay_class
    from ._cpu_stand_in import cpu_moe

    registry = replay_class().global_router_replay_instances
    before = list(registry)
    with megatron_on(device), cpu_moe() if device == "cpu" else contextlib.nullcontext():
        try:
            yield
        finally:
            registry[:] = before


def replay_routers(model: Any) -> list[Any]:
    from ._tiny_moe import routers

    found = [getattr(r, "router_replay", None) for r in routers(model)]
    expect(all(r is not None for r in found), "every MoE router of a model built after "
           "router_replay.enable(config) has replay state", f"{len(found)} routers with replay state",
           f"{sum(r is not None for r in found)}")
    return found


def drive(model_routers: list[Any], action: str | None, targets: list[torch.Tensor] | None = None) -> None:
    """Set this model's routers only (other models' routers in the process are not touched)."""
    from ..router_replay._owner import replay_module

    upstream = replay_module().RouterReplayAction
    for index, router in enumerate(model_routers):
        if targets is not None:
            router.clear_indices()
            router.set_target_indices(targets[index].long())
        if action is None:
            router.clear_router_replay_action()
        else:
            router.set_router_replay_action(upstream(action))


@contextlib.contextmanager
def replaying(device: str, target_for: Callable[[int], torch.Tensor]) -> Iterator[tuple[Any, Any]]:
    """A tiny MoE GPT on ``device`` and one causal batch, every router replaying ``target_for(tokens)``
    in forward (no grad); yields ``(model, batch)``, and clears the routers' replay on exit."""
    from ._tiny_moe import build_tiny_moe, causal_batch

    batch = causal_batch().to(device)
    with moe_replay(device), torch.no_grad():
        model = build_tiny_moe().to(device)
        model_routers = replay_routers(model)
        target = target_for(batch.input_ids.numel()).to(device)
        drive(model_routers, "replay_forward", [target] * len(model_routers))
        try:
            yield model, batch
        finally:
            drive(model_routers, None)
