"""Shared checks for the MTP patch tests (CPU and GPU): run the model, read what upstream computed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tiny_gpt import Batch

ATOL = 1e-5


def tracked_mtp_losses() -> torch.Tensor:
    """Per-depth MTP losses upstream logs (``values`` up to 0.18, ``loss_values`` from 0.19)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    tracker = MTPLossLoggingHelper.tracker
    values = tracker.get("loss_values", tracker.get("values"))
    assert values is not None, f"upstream logged no MTP loss; tracker keys: {sorted(tracker)}"
    return values.detach().clone()


def run(model: Any, batch: Batch, *, labels: bool = True) -> torch.Tensor:
    return model(
        batch.input_ids,
        batch.position_ids,
        batch.attention_mask,
        labels=batch.labels if labels else None,
        loss_mask=batch.loss_mask,
    )


def token_loss_from_logits(model: Any, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    """What an RL trainer would do with the returned logits: upstream's own per-token CE."""
    return model.compute_language_model_loss(batch.labels, logits.transpose(0, 1).contiguous())


def gradients(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def mtp_parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    params = {n: p for n, p in model.named_parameters() if n.startswith("mtp.")}
    assert params, "the model has no MTP parameters"
    return params


def outcome(call: Callable[[], torch.Tensor]) -> torch.Tensor | type[BaseException]:
    try:
        return call().detach()
    except Exception as error:  # upstream itself may refuse; the patch must refuse alike
        return type(error)


def assert_attached_mtp_losses_match_upstream(
    model: Any, batch: Batch, attached: list[torch.Tensor], mtp_num_layers: int
) -> None:
    """Run unpatched then patched on the same weights; attached and logged MTP losses must agree."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    import patchkit

    run(model, batch)
    upstream_attached = list(attached)
    upstream_tracked = tracked_mtp_losses()
    attached.clear()
    MTPLossLoggingHelper.tracker.clear()

    with patchkit.applied("megatron.mtp_postprocess"):
        run(model, batch)
    assert len(upstream_attached) == mtp_num_layers
    assert len(attached) == mtp_num_layers
    for depth, (ours, theirs) in enumerate(zip(attached, upstream_attached, strict=True)):
        assert ours.abs().sum() > 0, f"depth {depth + 1} attached an all-zero loss"
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    torch.testing.assert_close(tracked_mtp_losses(), upstream_tracked, atol=ATOL, rtol=0)


def assert_trainer_gradients_match_upstream(model: Any, batch: Batch) -> None:
    """Upstream's loss path and (patched logits -> upstream CE) must give the same gradients."""
    import patchkit

    (run(model, batch) * batch.loss_mask).sum().backward()
    upstream_grads = gradients(model)
    model.zero_grad(set_to_none=True)

    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
    (token_loss_from_logits(model, batch, logits) * batch.loss_mask).sum().backward()
    ours = gradients(model)
    assert ours.keys() == upstream_grads.keys() == {n for n, _ in model.named_parameters()}
    for name, grad in ours.items():
        torch.testing.assert_close(grad, upstream_grads[name], atol=ATOL, rtol=0, msg=name)
