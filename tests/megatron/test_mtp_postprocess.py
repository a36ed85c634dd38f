"""megatron.mtp_postprocess and megatron.mtp_detach_inputs against the real megatron-core (CPU).

Every expected number comes from upstream itself: the same model instance (same weights, same
batch) is run unpatched first, and what upstream computes (its LM loss, the MTP losses it attaches
through ``MTPLossAutoScaler``, the MTP losses it logs, its gradients) is compared with the patched
run. fp32 throughout; tolerance 1e-5.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from mtp_checks import (
    ATOL,
    MCORE,
    assert_attached_mtp_losses_match_upstream,
    assert_trainer_gradients_match_upstream,
    mtp_parameters,
    outcome,
    run,
    token_loss_from_logits,
)
from packaging.version import Version
from tiny_gpt import VOCAB_SIZE, Batch

import patchkit

pytestmark = pytest.mark.usefixtures("empty_mtp_tracker")


def test_patch_reports_the_variant_for_this_release(megatron_cpu: None) -> None:
    expected = "inline-mtp-loss" if MCORE < Version("0.17") else "process-mtp-loss"
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs") as records:
        by_id = {record.id: record for record in records}
    assert by_id["megatron.mtp_postprocess"].state.value == "applied", by_id["megatron.mtp_postprocess"]
    assert by_id["megatron.mtp_postprocess"].variant == expected
    assert by_id["megatron.mtp_detach_inputs"].state.value == "applied", by_id["megatron.mtp_detach_inputs"]


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_forward_with_labels_returns_main_head_logits_batch_major(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int
) -> None:

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
    if calculate_per_token_loss and MCORE < Version("0.17"):
        pytest.skip(
            "0.14-0.16 weigh per-token MTP losses unlike 0.17+; the patch follows 0.17+ "
            "(test_mtp_loss_normalisation.py compares with 0.17+'s recorded numbers)"
        )
    model = tiny_gpt(mtp_num_layers=mtp_num_layers, calculate_per_token_loss=calculate_per_token_loss)
    assert_attached_mtp_losses_match_upstream(model, batch, attached_mtp_losses, mtp_num_layers)


@pytest.mark.parametrize("head", ["trained", "detached"])
@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_trainer_loss_on_patched_logits_gives_upstreams_gradients(
    tiny_gpt: Callable[..., Any], batch: Batch, mtp_num_layers: int, head: str
) -> None:
    # "trained" is upstream's output-head choice: every gradient equal. "detached" (the default):
    # every gradient but the output layer's equal.
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    assert_trainer_gradients_match_upstream(model, batch, head=head)


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
def test_labels_none_returns_main_head_logits(
    tiny_gpt: Callable[..., Any], batch: Batch, attached_mtp_losses: list[torch.Tensor], training: bool
) -> None:
    # A reference-model log-prob pass calls forward without labels. Upstream 0.14-0.16 raise there
    # (they clone labels for MTP), 0.17-0.18 run the MTP block for no loss, 0.19 derives MTP labels
    # from input_ids and attaches MTP losses; the patch returns the main-head logits and skips MTP
    # on every release (test_mtp_labels_and_detach.py: gradients, and the "derive" option).
    model = tiny_gpt(mtp_num_layers=1)
    model.train(training)
    upstream = outcome(lambda: run(model, batch, labels=False))
    upstream_attached = len(attached_mtp_losses)
    attached_mtp_losses.clear()
    with patchkit.applied("megatron.mtp_postprocess"):
        patched = run(model, batch, labels=False).detach()
        with_labels = run(model, batch).detach()
    assert patched.shape == (*batch.labels.shape, VOCAB_SIZE)
    assert torch.equal(patched, with_labels)  # the main head's logits, whatever MTP does
    if MCORE < Version("0.17"):
        assert upstream is AttributeError
        assert len(attached_mtp_losses) == 1  # only the labelled call attached an MTP loss
    else:
        assert isinstance(upstream, torch.Tensor) and torch.equal(patched, upstream)
        assert upstream_attached == (1 if MCORE >= Version("0.19") else 0)
        assert len(attached_mtp_losses) == 1  # only the labelled call attached an MTP loss


def test_eval_mode_with_labels_returns_logits_and_logs_nothing(tiny_gpt: Callable[..., Any], batch: Batch) -> None:
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


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_packed_sequences_roll_mtp_labels_like_upstream(
    tiny_gpt: Callable[..., Any], attached_mtp_losses: list[torch.Tensor], mtp_num_layers: int
) -> None:
    # Local attention cannot run packed (THD) sequences on CPU, so the postprocess is driven
    # directly with decoder + MTP hidden states, as a THD forward would hand them over.
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    generator = torch.Generator().manual_seed(11)
    cu_seqlens = torch.tensor([0, 5, 11, 16], dtype=torch.int32)
    tokens = int(cu_seqlens[-1])
    packed = PackedSeqParams(
        qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens, max_seqlen_q=6, max_seqlen_kv=6
    )
    hidden = torch.randn((1 + mtp_num_layers) * tokens, 1, 64, generator=generator)
    labels = torch.randint(0, VOCAB_SIZE, (1, tokens), generator=generator)
    loss_mask = torch.ones(1, tokens)
    loss_mask[0, 7] = 0.0

    def attached(packed_seq_params: Any) -> list[torch.Tensor]:
        attached_mtp_losses.clear()
        model._postprocess(
            hidden_states=hidden.clone(), input_ids=labels, position_ids=None, labels=labels,
            rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, mtp_in_postprocess=False,
            loss_mask=loss_mask, packed_seq_params=packed_seq_params,
        )
        return list(attached_mtp_losses)

    upstream = attached(packed)
    with patchkit.applied("megatron.mtp_postprocess"):
        ours = attached(packed)
        ours_unpacked = attached(None)
    assert len(ours) == len(upstream) == mtp_num_layers
    for depth, (mine, theirs) in enumerate(zip(ours, upstream, strict=True)):
        torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0, msg=f"depth {depth + 1}")
    if "packed_seq_params" in inspect.signature(roll_tensor).parameters:
        # Where upstream rolls per sequence, so must the patch: ignoring the packing would differ.
        assert not all(torch.allclose(a, b) for a, b in zip(ours, ours_unpacked, strict=True))


@pytest.mark.parametrize(
    ("environ", "expected_state"),
    [({}, "skipped"), ({"PATCHKIT_ENABLE": "megatron.mtp_*"}, "applied")],
)
def test_apply_all_installs_both_mtp_patches_only_when_enabled(
    megatron_cpu: None, environ: dict[str, str], expected_state: str
) -> None:
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer
    from patchkit.patches.megatron.mtp import mtp_detach_inputs, mtp_postprocess, mtp_recompute

    originals = (GPTModel.__dict__["_postprocess"], MultiTokenPredictionLayer.__dict__["_get_embeddings"])
    engine = patchkit.Engine()
    for patch in (*mtp_postprocess.PATCHES, *mtp_detach_inputs.PATCHES, *mtp_recompute.PATCHES):
        if patch.id != "megatron.mtp_recompute":  # not opt-in: applied by apply_all regardless
            engine.register(patch, "patchkit.patches.megatron.mtp")
    try:
        records = {record.id: record for record in engine.apply_all(environ=environ)}
        for patch_id in ("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
            assert records[patch_id].state.value == expected_state
            if expected_state == "skipped":
                assert records[patch_id].reason.value == "opt_in"
        assert (GPTModel.__dict__["_postprocess"] is not originals[0]) == (expected_state == "applied")
    finally:
        engine.revert_all()
    assert (GPTModel.__dict__["_postprocess"], MultiTokenPredictionLayer.__dict__["_get_embeddings"]) == originals
