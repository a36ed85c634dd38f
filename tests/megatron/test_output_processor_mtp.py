"""megatron.output_processor with MTP layers in the stage: 0.18's processor branch on every release.

0.18 runs the MTP block, attaches each depth's loss to the main hidden states (``process_mtp_loss``)
and hands the main chunk to the processor. Two proofs, each run on 0.14-0.19 (natively on 0.18+):

- a whole forward: the processor's log-probs, the MTP losses attached and logged, and every
  parameter's gradient (MTP layers included) equal those of the same model's forward without a
  processor, whose MTP loss is the release's own (the batch has no per-token loss and no depth
  without tokens, where 0.14-0.16's own loss would differ from 0.18's);
- the recorded 0.17+ losses of ``fixtures/mtp_loss_upstream.json`` (the maths 0.18 runs: clamped
  counts, per-token rescale, masks with holes), replayed through the processor branch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from mtp_checks import tracked_mtp_losses
from mtp_loss_reference import CASES, FIXTURE, SEQ_LEN, build_model, read_fixture, recording_attached_losses
from patchkit.patches.megatron.gpt._checks._output_processor_probe import LogProbContext, chunked_label_log_probs
from replay_models import megatron_version

import patchkit

PATCH = "megatron.output_processor"
NATIVE = megatron_version() >= (0, 18)
TOLERANCE = {"atol": 1e-6, "rtol": 1e-5}

pytestmark = pytest.mark.usefixtures("megatron_cpu", "empty_mtp_tracker")


@pytest.fixture
def hook() -> Any:
    with patchkit.applied(PATCH) as (status,):
        yield status


def _tracked_mtp_losses() -> torch.Tensor:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    values = tracked_mtp_losses()
    MTPLossLoggingHelper.tracker.clear()
    return values


def _gradients(model: Any, objective: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    objective.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def _weights(batch: Any) -> torch.Tensor:
    return batch.loss_mask * torch.linspace(0.5, 1.5, batch.loss_mask.numel()).view_as(batch.loss_mask)


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_forward_with_a_processor_trains_mtp_as_the_forward_without_one(hook, tiny_gpt, batch, mtp_num_layers):
    model = tiny_gpt(mtp_num_layers=mtp_num_layers)
    weights = _weights(batch)
    inputs = (batch.input_ids, batch.position_ids, batch.attention_mask)

    with recording_attached_losses() as upstream_attached:
        per_token_loss = model(*inputs, labels=batch.labels, loss_mask=batch.loss_mask)  # upstream: -log p(label)
    upstream_logged = _tracked_mtp_losses()
    upstream_grads = _gradients(model, (-per_token_loss * weights).sum())

    context = LogProbContext(chunk=5)
    with recording_attached_losses() as processor_attached:
        log_probs = model(*inputs, labels=batch.labels, loss_mask=batch.loss_mask,
                          output_processor=chunked_label_log_probs, output_processor_context=context)
    processor_logged = _tracked_mtp_losses()
    processor_grads = _gradients(model, (log_probs * weights).sum())

    assert context.received["hidden_states"].shape[0] == SEQ_LEN  # the main chunk, MTP depths cut off
    torch.testing.assert_close(log_probs, -per_token_loss, **TOLERANCE)
    assert len(processor_attached) == len(upstream_attached) == mtp_num_layers
    for depth, (ours, theirs) in enumerate(zip(processor_attached, upstream_attached, strict=True), start=1):
        assert float(ours.abs().sum()) > 0
        torch.testing.assert_close(ours, theirs, **TOLERANCE, msg=f"attached MTP loss, depth {depth}")
    torch.testing.assert_close(processor_logged, upstream_logged, **TOLERANCE)
    assert upstream_grads.keys() == processor_grads.keys()
    assert any(name.startswith("mtp.") for name in processor_grads), "the MTP layers get gradients"
    for name, grad in upstream_grads.items():
        torch.testing.assert_close(processor_grads[name], grad, **TOLERANCE, msg=name)
    assert "_postprocess" not in vars(model)


def test_eval_forward_with_a_processor_computes_the_mtp_loss_without_logging_it(hook, tiny_gpt, batch):
    """As 0.18: eval mode still attaches the MTP loss (not inference: no inference context); only training logs."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    model = tiny_gpt(mtp_num_layers=1).eval()
    with recording_attached_losses() as attached:
        model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
              loss_mask=batch.loss_mask, output_processor=chunked_label_log_probs,
              output_processor_context=LogProbContext())
    assert len(attached) == 1
    assert not {"values", "loss_values"} & set(MTPLossLoggingHelper.tracker)


def test_without_labels_the_processor_gets_the_main_chunk_and_no_mtp_loss(hook, tiny_gpt, batch):
    """0.18: no labels, no MTP loss (0.19 derives labels from input_ids here; 0.18's semantics are the patch's)."""
    model = tiny_gpt(mtp_num_layers=1)
    received: dict[str, Any] = {}

    def keep(*, hidden_states: torch.Tensor, **_: Any) -> torch.Tensor:
        received["hidden_states"] = hidden_states
        return hidden_states

    with recording_attached_losses() as attached:
        model(batch.input_ids, batch.position_ids, batch.attention_mask, output_processor=keep)
    assert received["hidden_states"].shape[0] == SEQ_LEN
    if megatron_version() >= (0, 19):
        assert len(attached) == 1  # 0.19: labels rolled from input_ids
    else:
        assert attached == []


@pytest.mark.parametrize(("mtp_num_layers", "calculate_per_token_loss"), CASES)
def test_processor_branch_attaches_the_recorded_upstream_losses(hook, mtp_num_layers, calculate_per_token_loss):
    assert FIXTURE.exists(), f"{FIXTURE} missing: run tests/megatron/make_mtp_loss_fixture.py on megatron-core 0.17+"
    _, inputs, cases = read_fixture()
    model = build_model(mtp_num_layers, calculate_per_token_loss, inputs["output_weight"])
    hidden = inputs["hidden_states"][: (1 + mtp_num_layers) * SEQ_LEN].clone()
    kwargs = dict(hidden_states=hidden, input_ids=inputs["labels"], position_ids=None, labels=inputs["labels"],
                  rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None, mtp_in_postprocess=False,
                  loss_mask=inputs["loss_mask"])

    def main_chunk(*, hidden_states: torch.Tensor, **_: Any) -> torch.Tensor:
        return hidden_states

    with recording_attached_losses() as attached:
        if NATIVE:
            result = model._postprocess(**kwargs, output_processor=main_chunk, output_processor_context=None)
        else:  # the branch the patched forward installs for the call
            from patchkit.patches.megatron.gpt._output_processor import _processor_postprocess

            result = _processor_postprocess(model, main_chunk, None)(**kwargs)
    torch.testing.assert_close(result, hidden[:SEQ_LEN], rtol=0, atol=0)
    expected = cases[(mtp_num_layers, calculate_per_token_loss)]
    assert len(attached) == len(expected)
    for depth, (ours, theirs) in enumerate(zip(attached, expected, strict=True), start=1):
        torch.testing.assert_close(ours, theirs, **TOLERANCE, msg=f"depth {depth}")


def test_composes_with_mtp_postprocess(hook, tiny_gpt, batch):
    """With megatron.mtp_postprocess enabled on the model, a call with a processor is 0.18's processor branch
    (0.18+: that patch hands such calls to upstream), and one without is mtp_postprocess's (logits)."""
    from patchkit.patches.megatron import mtp

    model = tiny_gpt(mtp_num_layers=1)
    inputs = (batch.input_ids, batch.position_ids, batch.attention_mask)
    call = dict(labels=batch.labels, loss_mask=batch.loss_mask, output_processor=chunked_label_log_probs)
    with recording_attached_losses() as alone:
        expected = model(*inputs, **call, output_processor_context=LogProbContext())
    with patchkit.applied("megatron.mtp_postprocess"):
        mtp.enable(model)
        with recording_attached_losses() as composed:
            result = model(*inputs, **call, output_processor_context=LogProbContext())
        logits = model(*inputs, labels=batch.labels, loss_mask=batch.loss_mask)
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    assert len(composed) == len(alone) == 1
    torch.testing.assert_close(composed[0], alone[0], rtol=0, atol=0)
    assert logits.shape == (*batch.labels.shape, model.vocab_size)
