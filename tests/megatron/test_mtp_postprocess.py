"""megatron.mtp_postprocess and megatron.mtp_detach_inputs against the real megatron-core (CPU).

Every expected number comes from upstream itself: the same model instance (same weights, same
batch) is run unpatched first, and what upstream computes (its LM loss, the MTP losses it attaches
through ``MTPLossAutoScaler``, the MTP losses it logs, its gradients) is compared with the patched
run. fp32 throughout; tolerance 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

import pytest
import torch
from conftest import Batch
from packaging.version import Version

import patchkit

MCORE = Version(version("megatron-core"))
ATOL = 1e-5


@pytest.fixture(autouse=True)
def _empty_mtp_tracker() -> Iterator[None]:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()
    yield
    MTPLossLoggingHelper.tracker.clear()


@pytest.fixture
def attached_mtp_losses(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every loss tensor handed to ``MTPLossAutoScaler.apply``, in call order (upstream's or ours)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler

    recorded: list[torch.Tensor] = []
    original_apply = MTPLossAutoScaler.apply

    def recording_apply(output: torch.Tensor, mtp_loss: torch.Tensor) -> torch.Tensor:
        recorded.append(mtp_loss.detach().clone())
        return original_apply(output, mtp_loss)

    monkeypatch.setattr(MTPLossAutoScaler, "apply", recording_apply)
    return recorded


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


def test_patch_reports_the_variant_for_this_release(megatron_cpu: None) -> None:
    expected = (
        "inline-mtp-loss" if MCORE < Version("0.17") else
        "process-mtp-loss" if MCORE < Version("0.18") else
        "output-processor"
    )
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs") as records:
        by_id = {record.id: record for record in records}
    assert by_id["megatron.mtp_postprocess"].state.value == "applied", by_id["megatron.mtp_postprocess"]
    assert by_id["megatron.mtp_postprocess"].variant == expected
    assert by_id["megatron.mtp_detach_inputs"].state.value == "applied", by_id["megatron.mtp_detach_inputs"]


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_forward_with_labels_returns_main_head_logits_batch_major(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    from conftest import VOCAB_SIZE

    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    upstream_loss = run(model, batch).detach()
    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)
    # They are the main head's logits: upstream's LM loss follows from them exactly.
    torch.testing.assert_close(token_loss_from_logits(model, batch, logits), upstream_loss, atol=ATOL, rtol=0)


@pytest.mark.parametrize("calculate_per_token_loss", [False, True])
@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_attached_mtp_losses_equal_upstreams(
    tiny_gpt: Callable[..., Any],
    batch: Batch,
    attached_mtp_losses: list[torch.Tensor],
    mtp_num_layers: int,
    calculate_per_token_loss: bool,
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers, calculate_per_token_loss=calculate_per_token_loss)
    run(model, batch)
    upstream_attached = list(attached_mtp_losses)
    upstream_tracked = tracked_mtp_losses()
    attached_mtp_losses.clear()
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    MTPLossLoggingHelper.tracker.clear()

    with patchkit.applied("megatron.mtp_postprocess"):
        run(model, batch)
    assert len(upstream_attached) == mtp_num_layers
    assert len(attached_mtp_losses) == mtp_num_layers
    for depth, (ours, theirs) in enumerate(zip(attached_mtp_losses, upstream_attached)):
        assert ours.abs().sum() > 0, f"depth {depth + 1} attached an all-zero loss"
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    torch.testing.assert_close(tracked_mtp_losses(), upstream_tracked, atol=ATOL, rtol=0)


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_trainer_loss_on_patched_logits_gives_upstreams_gradients(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
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


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_every_mtp_parameter_gets_gradient_from_the_attached_loss(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
    # The trainer's loss ignores the logits entirely: any gradient now is the MTP loss's.
    (logits * 0.0).sum().backward()
    for name, param in mtp_parameters(model).items():
        assert param.grad is not None, f"{name} got no gradient"
        assert param.grad.abs().sum() > 0, f"{name} got an all-zero gradient"


def test_without_mtp_patched_forward_equals_upstream(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    model = tiny_gpt(mtp_num_layers=None)
    upstream_loss = run(model, batch).detach()
    upstream_logits = run(model, batch, labels=False).detach()
    with patchkit.applied("megatron.mtp_postprocess"):
        patched_loss = run(model, batch).detach()
        patched_logits = run(model, batch, labels=False).detach()
    assert torch.equal(patched_loss, upstream_loss)
    assert torch.equal(patched_logits, upstream_logits)


@pytest.mark.parametrize("training", [True, False])
def test_labels_none_behaves_exactly_like_upstream(
    tiny_gpt: Callable[..., Any], batch: Batch, training: bool
) -> None:
    # Upstream 0.14-0.16 raise here (they clone labels for MTP); 0.17+ return logits, 0.19 also
    # derives MTP labels from input_ids. Whatever upstream does, the patch must do the same.
    model = tiny_gpt(mtp_num_layers=1)
    model.train(training)
    upstream = outcome(lambda: run(model, batch, labels=False))
    with patchkit.applied("megatron.mtp_postprocess"):
        patched = outcome(lambda: run(model, batch, labels=False))
    if isinstance(upstream, torch.Tensor):
        assert isinstance(patched, torch.Tensor) and torch.equal(patched, upstream)
    else:
        assert patched is upstream


def test_eval_mode_with_labels_returns_logits_and_logs_nothing(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
    from conftest import VOCAB_SIZE
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model = tiny_gpt(mtp_num_layers=1).eval()
    with patchkit.applied("megatron.mtp_postprocess"):
        logits = run(model, batch)
    assert logits.shape == (*batch.labels.shape, VOCAB_SIZE)
    assert MTPLossLoggingHelper.tracker == {}


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_detach_patch_sends_no_mtp_gradient_into_the_main_model(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)

    def mtp_only_gradients(*patch_ids: str) -> dict[str, torch.Tensor | None]:
        model.zero_grad(set_to_none=True)
        with patchkit.applied(*patch_ids):
            (run(model, batch) * 0.0).sum().backward()
        return {n: (None if p.grad is None else p.grad.detach().clone()) for n, p in model.named_parameters()}

    def magnitude(grad: torch.Tensor | None) -> float:
        return 0.0 if grad is None else float(grad.abs().sum())

    attached = mtp_only_gradients("megatron.mtp_postprocess")
    detached = mtp_only_gradients("megatron.mtp_postprocess", "megatron.mtp_detach_inputs")

    embedding = "embedding.word_embeddings.weight"
    decoder = [n for n in attached if n.startswith("decoder.")]
    assert magnitude(attached[embedding]) > 0, "without the detach patch MTP loss must reach the embedding"
    assert any(magnitude(attached[n]) > 0 for n in decoder)
    assert magnitude(detached[embedding]) == 0.0
    assert all(magnitude(detached[n]) == 0.0 for n in decoder), [n for n in decoder if magnitude(detached[n])]
    for name in mtp_parameters(model):
        assert magnitude(detached[name]) > 0, f"{name} stopped training under the detach patch"
