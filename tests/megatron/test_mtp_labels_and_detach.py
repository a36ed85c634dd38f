"""Two MTP behaviours against the real megatron-core on CPU: a forward without labels, and
``mtp_detach_inputs`` with several MTP depths.

1. Without labels (a reference model's or a rollout's log-prob pass) the patched forward returns
   the main-head logits and runs no MTP layer on every release, so it trains exactly like the same
   model without MTP (megatron-core 0.19 itself derives labels from the input ids and attaches
   every depth's MTP loss). ``without_labels="derive"`` gives 0.19's behaviour on every release.
2. ``mtp_detach_inputs`` cuts the MTP block from the main model only: with 2 or 3 depths every MTP
   layer gets exactly the gradient it gets without the patch (later depths train earlier ones), the
   embedding and the decoder none; on 0.19 the gradients equal upstream's ``mtp_detach_heads``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from mtp_checks import (
    ATOL,
    MCORE,
    check_option_from_environment,
    gradients,
    mtp_parameters,
    output_head,
    run,
    token_loss_from_logits,
)
from packaging.version import Version
from tiny_gpt import VOCAB_SIZE, Batch

import patchkit

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


@pytest.fixture
def without_labels_default() -> Iterator[Callable[[str], None]]:
    from patchkit.patches.megatron.mtp import _options as _mtp_options

    yield lambda choice: _mtp_options.configure(without_labels=choice) and None
    _mtp_options.reset_default()


def _mtp_forward_count(model: Any) -> list[int]:
    calls = [0]
    for layer in model.mtp.layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def _same_backbone_without_mtp(model: Any, build: Callable[..., Any]) -> Any:
    plain = build(mtp_num_layers=None)
    backbone = {name: value for name, value in model.state_dict().items() if not name.startswith("mtp.")}
    plain.load_state_dict(backbone, strict=True)
    return plain


def _log_prob_pass_gradients(model: Any, batch: Batch, logits: torch.Tensor) -> dict[str, torch.Tensor]:
    (token_loss_from_logits(model, batch, logits) * batch.loss_mask).sum().backward()
    return gradients(model)


# --- 1. labels=None ------------------------------------------------------------------------------


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_forward_without_labels_runs_no_mtp_and_trains_like_the_model_without_mtp(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor], mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    plain = _same_backbone_without_mtp(model, tiny_gpt)
    mtp_calls = _mtp_forward_count(model)
    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch, labels=False)
        ours = _log_prob_pass_gradients(model, batch, logits)
    assert attached_mtp_losses == [], f"{len(attached_mtp_losses)} MTP losses attached to a pass without labels"
    assert mtp_calls == [0], "the MTP layers ran in a pass without labels"
    plain_logits = run(plain, batch, labels=False)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)
    assert torch.equal(logits.detach(), plain_logits.detach())
    expected = _log_prob_pass_gradients(plain, batch, plain_logits)
    assert ours.keys() == expected.keys(), "MTP parameters got gradient from a pass without labels"
    for name, grad in expected.items():
        torch.testing.assert_close(ours[name], grad, atol=0, rtol=0, msg=name)


def test_derive_option_attaches_the_losses_of_labels_rolled_from_the_input_ids(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor],
    without_labels_default: Callable[[str], None],
) -> None:
    model = tiny_gpt(mtp_num_layers=2)
    upstream_without_labels = None
    if MCORE >= Version("0.19"):
        run(model, batch, labels=False)  # upstream 0.19: labels derived from input_ids
        upstream_without_labels = list(attached_mtp_losses)
        attached_mtp_losses.clear()
    # What 0.19 derives: ids rolled left once (last position zeroed), the loss mask rolled alike.
    zeros = torch.zeros(batch.input_ids.shape[0], 1, dtype=batch.input_ids.dtype)
    labels = torch.cat([batch.input_ids[:, 1:], zeros], dim=1)
    loss_mask = torch.cat([batch.loss_mask[:, 1:], torch.zeros_like(batch.loss_mask[:, :1])], dim=1)
    without_labels_default("derive")
    with output_head("trained"), patchkit.applied("megatron.mtp_postprocess"):
        derived = run(model, batch, labels=False)
        derived_losses = list(attached_mtp_losses)
        attached_mtp_losses.clear()
        model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=labels, loss_mask=loss_mask)
        explicit_losses = list(attached_mtp_losses)
    assert derived.shape == (*batch.labels.shape, VOCAB_SIZE)
    assert len(derived_losses) == len(explicit_losses) == 2
    for depth, (got, want) in enumerate(zip(derived_losses, explicit_losses, strict=True)):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    if upstream_without_labels is not None:
        for depth, (got, want) in enumerate(zip(derived_losses, upstream_without_labels, strict=True)):
            torch.testing.assert_close(got, want, atol=ATOL, rtol=0, msg=f"0.19 upstream, depth {depth + 1}")


def test_without_labels_option_per_model_and_bad_values(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from patchkit.patches.megatron import mtp
    from patchkit.patches.megatron.mtp import _options as _mtp_options

    before = _mtp_options.default_options()
    with pytest.raises(_mtp_options.MTPOptionError, match="skip, derive"):
        _mtp_options.configure(output_head="trained", without_labels="always")
    assert _mtp_options.default_options() == before  # nothing half-configured
    model = tiny_gpt(mtp_num_layers=1)
    with pytest.raises(_mtp_options.MTPOptionError, match="without_labels"):
        mtp.enable(model, without_labels="yes")
    assert "_postprocess" not in vars(model)  # refused before binding anything
    mtp.enable(model, without_labels="derive")
    run(model, batch, labels=False)
    assert len(attached_mtp_losses) == 1
    check_option_from_environment(monkeypatch, "PATCHKIT_MTP_WITHOUT_LABELS", "Derive", "without_labels", "derive")


# --- 2. mtp_detach_inputs with several depths ----------------------------------------------------


def _mtp_only_gradients(model: Any, batch: Batch, *patch_ids: str) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    with patchkit.applied(*patch_ids):
        (run(model, batch) * 0.0).sum().backward()
    return {
        n: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()
    }


@pytest.mark.parametrize("mtp_num_layers", [2, 3])
def test_detach_inputs_keeps_later_depths_training_earlier_mtp_layers(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    attached = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess")
    detached = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess", "megatron.mtp_detach_inputs")
    again = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess", "megatron.mtp_detach_inputs")
    # Cutting the block's inputs from the main model changes no MTP layer's gradient.
    for name in mtp_parameters(model):
        assert float(detached[name].abs().sum()) > 0, f"{name} stopped training"
        torch.testing.assert_close(detached[name], attached[name], atol=ATOL, rtol=0, msg=name)
        assert torch.equal(again[name], detached[name]), f"{name}: a second forward differs"
    main_model = [n for n in detached if n.startswith(("embedding.", "decoder."))]
    assert any(float(attached[n].abs().sum()) > 0 for n in main_model)
    assert all(float(detached[n].abs().sum()) == 0 for n in main_model), [
        n for n in main_model if float(detached[n].abs().sum())
    ]
    assert not hasattr(batch.input_ids, "_patchkit_rolled_by_mtp"), "the batch's own ids were marked"


@pytest.mark.skipif(MCORE < Version("0.19"), reason="mtp_detach_heads is megatron-core 0.19+")
@pytest.mark.parametrize("mtp_num_layers", [2, 3])
def test_detach_inputs_gradients_equal_upstream_mtp_detach_heads(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    heads = tiny_gpt(mtp_num_layers=mtp_num_layers, mtp_detach_heads=True)
    heads.load_state_dict(model.state_dict(), strict=True)
    upstream = _mtp_only_gradients(heads, batch)  # unpatched: upstream's loss path with its own detach
    # mtp_detach_heads also keeps the MTP loss off the output layer: the patch's default head choice.
    ours = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess", "megatron.mtp_detach_inputs")
    assert ours.keys() == upstream.keys()
    for name, grad in upstream.items():
        torch.testing.assert_close(ours[name], grad, atol=ATOL, rtol=0, msg=name)


@pytest.mark.skipif(MCORE < Version("0.19"), reason="mtp_use_repeated_layer is megatron-core 0.19+")
def test_detach_inputs_with_one_mtp_layer_repeated_over_depths(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    # One layer object serves both depths: the depth is read from the ids, not from the layer.
    model = tiny_gpt(mtp_num_layers=2, mtp_use_repeated_layer=True)
    assert len(model.mtp.layers) == 1
    attached = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess")
    detached = _mtp_only_gradients(model, batch, "megatron.mtp_postprocess", "megatron.mtp_detach_inputs")
    for name in mtp_parameters(model):
        torch.testing.assert_close(detached[name], attached[name], atol=ATOL, rtol=0, msg=name)
    assert float(detached["embedding.word_embeddings.weight"].abs().sum()) == 0
