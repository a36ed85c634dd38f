"""megatron.mtp_router_slots on a tiny MoE GPT with MoE MTP layers (real megatron-core, CPU).

MTP routers must have layer slots of their own, after the decoder's (``num_layers + depth``):

- their load-balancing and z-loss in the MoE tracker: 0.14-0.15 add them into decoder layer 1's
  slot (the MTP layer numbers its inner layer from 1), 0.16 numbers the MTP layer after the
  decoder, 0.17+ offset MTP routers' logging (native);
- tracker entries ``track_moe_metrics(force_initialize=True)`` creates (a rank with only dense
  layers): 0.14-0.16 size them for the decoder only, routers size theirs decoder + MTP, so pipeline
  ranks would all-reduce tensors of different sizes (native from 0.17);
- the replay state's ``layer_number`` (new in 0.19): 0.19 numbers an MTP router's like the backbone
  layer it aliases (NeMo-RL #3903).
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import pytest
import torch
from packaging.version import Version
from patchkit.patches.megatron.mtp._checks._mtp_router_probe import (
    AUX_LOSS_CONFIG,
    empty_tracker,
    forced_entry_sizes,
    logged_layer_losses,
    replay_layer_numbers,
)
from replay_models import build_tiny_moe, causal_batch, forward_loss

import patchkit

MCORE = Version(version("megatron-core"))
PATCH = "megatron.mtp_router_slots"
NUM_LAYERS = 2


def _model(mtp_num_layers: Any, seed: int = 0) -> Any:
    return build_tiny_moe(seed=seed, mtp_num_layers=mtp_num_layers, mtp_loss_scaling_factor=0.1, **AUX_LOSS_CONFIG)


def _same_backbone_without_mtp(model: Any) -> Any:
    plain = _model(None)
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}, strict=True)
    return plain


def test_patch_selects_the_variant_for_this_release(moe_replay: dict) -> None:
    expected = ("number-after-decoder" if MCORE < Version("0.16") else "size-forced-tracker"
                if MCORE < Version("0.17") else "native-0.17" if MCORE < Version("0.19") else "replay-layer-number")
    with patchkit.applied(PATCH) as (record,):
        assert record.variant == expected, record
        if expected == "native-0.17":
            assert (record.state.value, record.reason.value) == ("skipped", "native"), record
        else:
            assert record.state.value == "applied", record


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_mtp_router_losses_are_logged_in_their_own_slots(moe_replay: dict, mtp_num_layers: int) -> None:
    batch = causal_batch()
    with patchkit.applied(PATCH):
        model = _model(mtp_num_layers)
        logged = logged_layer_losses(model, batch)
        with empty_tracker():
            loss = forward_loss(model, batch).detach()
    plain = logged_layer_losses(_same_backbone_without_mtp(model), batch)
    assert set(logged) == {"load_balancing_loss", "z_loss"}
    for name, values in logged.items():
        assert values.numel() == NUM_LAYERS + mtp_num_layers, name
        # The decoder's slots hold exactly what the same backbone without MTP logs ...
        torch.testing.assert_close(values[:NUM_LAYERS], plain[name], atol=1e-6, rtol=0, msg=name)
        # ... and every MTP router logs in a slot of its own.
        assert bool((values[NUM_LAYERS:] > 0).all()), f"{name}: MTP slots {values[NUM_LAYERS:].tolist()}"
    unpatched = _model(mtp_num_layers)  # same seed, same weights: renumbering changes no number
    with empty_tracker():
        assert torch.equal(forward_loss(unpatched, batch).detach(), loss)


def test_upstream_aliases_mtp_router_losses_only_before_016(moe_replay: dict) -> None:
    model = _model(2)
    logged = logged_layer_losses(model, causal_batch())["load_balancing_loss"]
    if MCORE < Version("0.16"):
        assert logged[NUM_LAYERS:].tolist() == [0.0, 0.0], "0.14-0.15 were expected to alias"
    else:
        assert bool((logged[NUM_LAYERS:] > 0).all()), "native from 0.16: MTP routers log after the decoder"


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_forced_tracker_entries_are_sized_for_decoder_and_mtp(moe_replay: dict, mtp_num_layers: int) -> None:
    with patchkit.applied(PATCH):
        sizes = forced_entry_sizes(NUM_LAYERS, mtp_num_layers)
    assert sizes == {"load_balancing_loss": NUM_LAYERS + mtp_num_layers, "z_loss": NUM_LAYERS + mtp_num_layers}
    upstream = forced_entry_sizes(NUM_LAYERS, mtp_num_layers)
    expected_upstream = NUM_LAYERS if MCORE < Version("0.17") else NUM_LAYERS + mtp_num_layers
    assert set(upstream.values()) == {expected_upstream}, upstream


def test_forced_tracker_keeps_entries_routers_already_made(moe_replay: dict) -> None:
    # An entry the routers created (this rank has MoE layers) is left as it is, values included.
    from patchkit.patches.megatron.mtp._checks._mtp_router_probe import tracked_values

    with patchkit.applied(PATCH), empty_tracker():
        model = _model(1)
        forward_loss(model, causal_batch()).sum().backward()
        before = tracked_values()
        from megatron.core.transformer.moe import moe_utils

        total: dict[str, torch.Tensor] = {}
        moe_utils.track_moe_metrics(
            loss_scale=1.0, iteration=1, writer=None, total_loss_dict=total, force_initialize=True,
            track_names=["load_balancing_loss"], num_layers=NUM_LAYERS, moe_layer_freq=1, mtp_num_layers=1,
        )
    torch.testing.assert_close(total["load_balancing_loss"], before["load_balancing_loss"].sum() / 3, atol=1e-6, rtol=0)


@pytest.mark.skipif(MCORE < Version("0.19"), reason="RouterReplay.layer_number is new in megatron-core 0.19")
@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_mtp_router_replay_states_are_numbered_after_the_decoder(moe_replay: dict, mtp_num_layers: int) -> None:
    from patchkit.patches.megatron import router_replay as replay

    upstream = replay_layer_numbers(_model(mtp_num_layers))
    upstream_mtp = sorted(n for name, n in upstream.items() if name.startswith("mtp."))
    assert upstream_mtp == list(range(1, mtp_num_layers + 1)), "0.19 was expected to alias backbone numbers"
    with patchkit.applied(PATCH):
        model = _model(mtp_num_layers)
        numbers = replay_layer_numbers(model)
        logged = logged_layer_losses(model, causal_batch())
    decoder = sorted(n for name, n in numbers.items() if name.startswith("decoder."))
    mtp = sorted(n for name, n in numbers.items() if name.startswith("mtp."))
    assert decoder == [1, 2]
    assert mtp == [NUM_LAYERS + depth for depth in range(1, mtp_num_layers + 1)]
    # The routers' own numbers are upstream's: their losses are still logged once, in the right slots.
    for name, values in logged.items():
        assert values.numel() == NUM_LAYERS + mtp_num_layers and bool((values > 0).all()), (name, values.tolist())
    assert replay.for_model(model).layers == (1, 2, *(f"mtp.{d}" for d in range(1, mtp_num_layers + 1)))
