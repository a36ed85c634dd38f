"""MTP loss contracts RL frameworks carry beyond the head and no-label options, on the real megatron-core (CPU).

1. ``mtp.loss_scale(factor)``: a per-forward factor on the MTP loss (verl hands one over per
   micro-batch) equals upstream's own ``mtp_loss_scaling_factor`` multiplied by it.
2. ``with_labels="derive"``: the MTP labels come from the input ids whatever labels the caller gave
   (ROLL), exactly the losses of those labels given explicitly.
3. ``with_labels="skip"``: a forward with labels runs no MTP layer and attaches nothing (ROLL's
   ``disabled`` training mode), returning the logits of the pass without labels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from mtp_checks import ATOL, run
from tiny_gpt import VOCAB_SIZE, Batch

import patchkit

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


def _input_id_labels(batch: Batch) -> torch.Tensor:
    """The input ids rolled left once (the last position zero), as upstream's ``roll_tensor`` rolls them."""
    zeros = torch.zeros(batch.input_ids.shape[0], 1, dtype=batch.input_ids.dtype)
    return torch.cat([batch.input_ids[:, 1:], zeros], dim=1)


def _forward(model: Any, batch: Batch, labels: torch.Tensor | None) -> torch.Tensor:
    return model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=labels, loss_mask=batch.loss_mask)


@pytest.mark.parametrize("per_token", [False, True])
def test_loss_scale_equals_upstreams_scaling_factor_times_the_factor(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor], per_token: bool
) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=2, calculate_per_token_loss=per_token)
    with patchkit.applied("megatron.mtp_postprocess"):
        with mtp.loss_scale(2.5):
            run(model, batch)
        scaled = list(attached_mtp_losses)
        attached_mtp_losses.clear()
        assert mtp.current_loss_scale() == 1.0  # the context ended
        model.config.mtp_loss_scaling_factor *= 2.5  # what the factor stands for, in upstream's own field
        run(model, batch)
        by_config = list(attached_mtp_losses)
    assert len(scaled) == len(by_config) == 2
    for depth, (got, want) in enumerate(zip(scaled, by_config, strict=True)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    assert any(float(loss.abs().sum()) > 0 for loss in scaled)


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), float("inf")])
def test_loss_scale_refuses_a_factor_that_is_not_positive_and_finite(factor: float) -> None:
    from patchkit.patches.megatron import mtp

    with pytest.raises(mtp.MTPOptionError, match="positive finite"):
        with mtp.loss_scale(factor):
            pass
    assert mtp.current_loss_scale() == 1.0


def test_with_labels_derive_takes_mtp_labels_from_input_ids_whatever_labels_are_given(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=2)
    other_labels = (batch.labels + 7) % VOCAB_SIZE  # what a caller's own labels may hold: not the ids
    mtp.enable(model, with_labels="derive", output_head="trained")
    derived_logits = _forward(model, batch, other_labels)
    derived = list(attached_mtp_losses)
    attached_mtp_losses.clear()
    mtp.enable(model, with_labels="attach", output_head="trained")
    explicit_logits = _forward(model, batch, _input_id_labels(batch))
    explicit = list(attached_mtp_losses)
    attached_mtp_losses.clear()
    _forward(model, batch, other_labels)
    from_caller = list(attached_mtp_losses)

    torch.testing.assert_close(derived_logits, explicit_logits, atol=0, rtol=0)
    assert len(derived) == len(explicit) == 2
    for depth, (got, want) in enumerate(zip(derived, explicit, strict=True)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    assert not torch.allclose(from_caller[0], derived[0])  # the caller's labels would have given others


def test_with_labels_skip_runs_no_mtp_layer_and_returns_the_log_prob_pass_logits(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor]
) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=2)
    calls = [0]
    for layer in model.mtp.layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    mtp.enable(model, with_labels="skip")
    logits = run(model, batch)
    assert attached_mtp_losses == [] and calls == [0]
    assert mtp.options_for(model).with_labels == "skip"
    mtp.enable(model, with_labels="attach")
    without_labels = run(model, batch, labels=False)  # default without_labels="skip": the main head only
    torch.testing.assert_close(logits, without_labels, atol=0, rtol=0)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)


def test_with_labels_refuses_an_unknown_choice_before_changing_the_model(tiny_gpt: Callable[..., Any]) -> None:
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=1)
    with pytest.raises(mtp.MTPOptionError, match="attach, derive, skip"):
        mtp.enable(model, with_labels="disabled")
    assert "_postprocess" not in vars(model)
