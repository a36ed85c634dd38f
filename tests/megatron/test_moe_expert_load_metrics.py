"""``megatron.moe_expert_load_metrics``: routers log how evenly they spread tokens, on the real megatron-core (CPU).

ROLL replaces ``TopKRouter._apply_aux_loss`` (``mcore_adapter/patcher.py:patch_apply_aux_loss``) to
log ``expert_distributed_std`` and ``max_token_per_expert`` of the tokens per expert in the MoE
tracker. The patch logs the same two values, from the counts upstream's own load-balancing loss uses,
in the slot upstream logs that router's loss, and nothing where upstream logs no loss.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from patchkit.patches.megatron.moe._checks._expert_load_probe import AUX_LOSS_CONFIG, training_step
from patchkit.patches.megatron.moe._moe_expert_load_metrics import MAX_METRIC, STD_METRIC
from replay_models import build_tiny_moe, causal_batch

import patchkit
from patchkit.selfcheck import SelfCheckFailed, upstream_behaviour

PATCH = "megatron.moe_expert_load_metrics"
NUM_LAYERS = 2


def _stats(counts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """ROLL's two values per router: ``std(tokens, unbiased=False)`` and ``max(tokens)``."""
    stacked = torch.stack([c.to(torch.float) for c in counts])
    return stacked.std(dim=1, unbiased=False), stacked.max(dim=1).values


def test_routers_log_std_and_max_of_the_tokens_their_loss_counted(moe_replay: dict) -> None:
    model = build_tiny_moe(**AUX_LOSS_CONFIG)
    batch = causal_batch()
    with patchkit.applied(PATCH) as (status,):
        assert status.state.value == "applied", status
        step = training_step(model, batch)
    assert len(step.counted) == NUM_LAYERS
    want_std, want_max = _stats(step.counted)
    assert bool((want_std > 0).all()), "the tiny model was expected to route unevenly"
    torch.testing.assert_close(step.tracked[STD_METRIC].float(), want_std, atol=1e-6, rtol=0)
    torch.testing.assert_close(step.tracked[MAX_METRIC].float(), want_max, atol=0, rtol=0)


def test_upstream_logs_neither_metric(moe_replay: dict) -> None:
    step = training_step(build_tiny_moe(**AUX_LOSS_CONFIG), causal_batch())
    assert "load_balancing_loss" in step.tracked
    assert STD_METRIC not in step.tracked and MAX_METRIC not in step.tracked


def test_the_patch_changes_no_loss_and_no_gradient(moe_replay: dict) -> None:
    batch = causal_batch()
    plain = build_tiny_moe(**AUX_LOSS_CONFIG)
    training_step(plain, batch)
    patched = build_tiny_moe(**AUX_LOSS_CONFIG)  # same seed: same weights
    with patchkit.applied(PATCH):
        step = training_step(patched, batch)
    for (name, a), b in zip(plain.named_parameters(), patched.parameters(), strict=True):
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad), name
    assert STD_METRIC in step.tracked


@pytest.mark.parametrize("config", [
    {"moe_router_load_balancing_type": "none"},
    {"moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0},
], ids=["no-balancing", "zero-coefficient"])
def test_nothing_is_logged_where_upstream_logs_no_balancing_loss(moe_replay: dict, config: dict[str, Any]) -> None:
    with patchkit.applied(PATCH):
        step = training_step(build_tiny_moe(**config), causal_batch())
    assert STD_METRIC not in step.tracked and MAX_METRIC not in step.tracked
    assert "load_balancing_loss" not in step.tracked


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_mtp_routers_log_in_the_slot_of_their_loss_sized_decoder_and_mtp(moe_replay: dict, mtp_num_layers: int) -> None:
    """With ``megatron.mtp_router_slots`` (on by default) MTP routers log after the decoder's on every
    release; the metrics go where each router's load-balancing loss goes."""
    with patchkit.applied(PATCH, "megatron.mtp_router_slots"):
        model = build_tiny_moe(mtp_num_layers=mtp_num_layers, mtp_loss_scaling_factor=0.1, **AUX_LOSS_CONFIG)
        step = training_step(model, causal_batch())
    losses = step.tracked["load_balancing_loss"]
    assert losses.numel() == NUM_LAYERS + mtp_num_layers
    assert bool((losses > 0).all()), losses.tolist()
    want_std, want_max = _stats(step.counted)  # routers in call order: decoder, then MTP depths
    torch.testing.assert_close(step.tracked[STD_METRIC].float(), want_std, atol=1e-6, rtol=0)
    torch.testing.assert_close(step.tracked[MAX_METRIC].float(), want_max, atol=0, rtol=0)


@pytest.mark.breaks("megatron.moe_expert_load_metrics")
def test_self_check_passes_and_fails_with_upstreams_code(moe_replay: dict) -> None:
    from patchkit.patches.megatron.moe._checks.moe_expert_load_metrics import check_moe_expert_load_metrics

    from patchkit.selfcheck import CheckContext

    with patchkit.applied(PATCH):
        check_moe_expert_load_metrics(CheckContext(PATCH))
        with upstream_behaviour(PATCH), pytest.raises(SelfCheckFailed, match="both metrics"):
            check_moe_expert_load_metrics(CheckContext(PATCH))
