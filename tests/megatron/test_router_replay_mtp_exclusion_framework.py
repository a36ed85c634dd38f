"""``router_replay.exclude_mtp`` against a framework's own MTP exclusion, on the real megatron-core (CPU).

NeMo-RL (``nemo_rl/models/megatron/router_replay.py``, ``NRL_ROUTER_REPLAY_EXCLUDE_MTP``, on by
default) collects the model's replay states by walking its modules, skips those beneath an MTP
layer, and sets targets and ``replay_forward`` on the rest one by one; the MTP routers keep a
replay state that never gets an action, so they route by their own top-k. With ``exclude_mtp``
called once after building, the same walk without the MTP filter finds the decoder's states only,
and every router routes as under the framework's filter (the MTP router on its own top-k of the
replayed decoder's output).
"""

from __future__ import annotations

from typing import Any

import torch
from patchkit.patches.megatron import router_replay as replay
from patchkit.patches.megatron.router_replay._owner import replay_module
from replay_models import NUM_EXPERTS, TOPK, RoutingCapture, build_tiny_moe, causal_batch, forward_loss

TOKENS = 32  # causal_batch(): 2 sequences of 16


def _targets(layers: int) -> list[torch.Tensor]:
    """A top-k of distinct experts per token and layer, unlike what the routers would choose."""
    generator = torch.Generator().manual_seed(11)
    return [
        torch.stack([torch.randperm(NUM_EXPERTS, generator=generator)[:TOPK] for _ in range(TOKENS)])
        for _ in range(layers)
    ]


def _model() -> Any:
    return build_tiny_moe(mtp_num_layers=1, mtp_loss_scaling_factor=0.1, seed=0)


def _replay_states(model: Any, *, skip_mtp: bool) -> list[Any]:
    """The framework's walk: every module's ``router_replay``, optionally not beneath the MTP block."""
    return [
        module.router_replay
        for name, module in model.named_modules()
        if getattr(module, "router_replay", None) is not None and not (skip_mtp and name.startswith("mtp."))
    ]


def _replayed_maps(model: Any, states: list[Any], targets: list[torch.Tensor]) -> list[torch.Tensor]:
    action = replay_module().RouterReplayAction("replay_forward")
    for state, target in zip(states, targets, strict=True):
        state.set_target_indices(target)
        state.set_router_replay_action(action)
    capture = RoutingCapture(model)
    with torch.no_grad():
        forward_loss(model, causal_batch())
    maps = capture.take()
    capture.remove()
    for state in states:
        state.clear_router_replay_action()
        state.clear_indices()
    return maps


def test_exclude_mtp_routes_as_a_framework_that_skips_mtp_replay_states(moe_replay: dict) -> None:
    targets = _targets(2)

    framework_model = _model()
    framework_states = _replay_states(framework_model, skip_mtp=True)
    assert len(framework_states) == 2
    framework_maps = _replayed_maps(framework_model, framework_states, targets)

    patchkit_model = _model()  # the same weights
    assert replay.exclude_mtp(patchkit_model) == ["mtp.1"]
    patchkit_states = _replay_states(patchkit_model, skip_mtp=False)  # no filter of its own
    assert len(patchkit_states) == 2
    patchkit_maps = _replayed_maps(patchkit_model, patchkit_states, targets)

    assert len(framework_maps) == len(patchkit_maps) == 3  # decoder 1, decoder 2, MTP
    for layer, (got, want) in enumerate(zip(patchkit_maps, framework_maps, strict=True)):
        assert torch.equal(got, want), f"router {layer + 1} routes unlike the framework's exclusion"
    for layer, target in enumerate(targets):  # the decoder replays its targets
        assert torch.equal(patchkit_maps[layer].nonzero()[:, 1].view(TOKENS, TOPK).sort(dim=1).values,
                           target.sort(dim=1).values)
