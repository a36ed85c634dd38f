"""megatron.output_processor: 0.18's ``GPTModel.forward(output_processor=...)`` on every release.

0.14-0.17 through the patch, 0.18/0.19 natively (the same tests show upstream doing it). A chunked
log-prob processor gets the hidden states and the output weight; the output layer never runs, and
the log-probs (and their gradients) equal those from upstream's full logits.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from patchkit.patches.megatron.gpt._checks._output_processor_probe import (
    LogProbContext,
    OutputLayerCalls,
    build_gpt,
    chunked_label_log_probs,
    label_log_probs_from_logits,
)
from replay_models import megatron_version
from tiny_gpt import SEQ_LEN, VOCAB_SIZE, Batch

import patchkit

PATCH = "megatron.output_processor"
NATIVE = megatron_version() >= (0, 18)


@pytest.fixture
def hook(megatron_cpu: None):
    with patchkit.applied(PATCH) as (status,):
        yield status


def _models() -> dict[str, Any]:
    return {"tied": build_gpt(True, SEQ_LEN, VOCAB_SIZE), "untied": build_gpt(False, SEQ_LEN, VOCAB_SIZE)}


def _processed(model: Any, batch: Batch, context: LogProbContext) -> torch.Tensor:
    return model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                 loss_mask=batch.loss_mask, output_processor=chunked_label_log_probs,
                 output_processor_context=context)


def _reference(model: Any, batch: Batch) -> torch.Tensor:
    logits = model(batch.input_ids, batch.position_ids, batch.attention_mask)
    return label_log_probs_from_logits(logits, batch.labels)


def test_patch_on_014_to_017_native_from_018(hook):
    record = hook.to_dict()
    if NATIVE:
        assert (record["state"], record["reason"]) == ("skipped", "native")
    else:
        assert (record["state"], record["variant"]) == ("applied", "forward-keywords")


def test_forward_signature_names_both_keywords(hook):
    """verl picks the hook path when both names are in inspect.signature(GPTModel.forward)."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    assert {"output_processor", "output_processor_context"} <= set(inspect.signature(GPTModel.forward).parameters)


def test_a_models_bound_forward_names_both_keywords(hook, tiny_gpt):
    """verl probes the model's own (bound) forward; an MTP model's too."""
    model = tiny_gpt(mtp_num_layers=1)
    assert {"output_processor", "output_processor_context"} <= set(inspect.signature(model.forward).parameters)


@pytest.mark.parametrize("weights", ["tied", "untied"])
def test_processor_log_probs_equal_full_logits_and_no_logits_are_made(hook, tiny_gpt, batch, weights):
    model = _models()[weights]
    expected = _reference(model, batch)
    context = LogProbContext(chunk=5)  # 16 positions: chunks of 5, 5, 5, 1
    calls = OutputLayerCalls(model)
    try:
        result = _processed(model, batch, context)
    finally:
        calls.remove()
    assert calls.count == 0
    assert result.shape == expected.shape == batch.labels.shape
    torch.testing.assert_close(result, expected, rtol=0, atol=1e-5)
    received = context.received
    assert received["hidden_states"].shape == (SEQ_LEN, batch.labels.shape[0], 64)
    if weights == "tied":
        assert received["output_weight"] is model.shared_embedding_or_output_weight()
    else:
        assert received["output_weight"] is None and received["output_layer"].weight is model.output_layer.weight
    assert received["labels"] is batch.labels and received["loss_mask"] is batch.loss_mask
    assert received["config"] is model.config
    assert set(received) >= {"input_ids", "position_ids", "attention_mask", "decoder_input", "inference_context",
                             "packed_seq_params", "runtime_gather_output", "compute_language_model_loss",
                             "scale_logits"}


def test_processor_gradients_equal_full_logit_gradients(hook, tiny_gpt, batch):
    model = tiny_gpt(mtp_num_layers=None)
    weights = (batch.loss_mask.float() * torch.linspace(0.5, 1.5, batch.loss_mask.numel()).view_as(batch.loss_mask))

    def grads(log_probs: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (log_probs * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    reference = grads(_reference(model, batch))
    processed = grads(_processed(model, batch, LogProbContext(chunk=3)))
    assert reference.keys() == processed.keys() and reference
    for name in reference:
        torch.testing.assert_close(processed[name], reference[name], rtol=0, atol=1e-5, msg=name)


def test_without_a_processor_forward_is_upstreams(hook, tiny_gpt, batch):
    from megatron.core.models.gpt.gpt_model import GPTModel

    if NATIVE:
        pytest.skip("nothing is installed on 0.18+")
    model = tiny_gpt(mtp_num_layers=None)
    patched = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels)
    with patchkit.selfcheck.upstream_behaviour(PATCH):
        upstream = GPTModel.forward(model, batch.input_ids, batch.position_ids, batch.attention_mask,
                                    labels=batch.labels)
    assert torch.equal(patched, upstream)


def test_the_context_reaches_the_processor_and_the_model_is_left_as_it_was(hook, tiny_gpt, batch):
    """A processor that raises leaves no per-call state on the model; a per-instance _postprocess is kept."""
    model = tiny_gpt(mtp_num_layers=None)
    marker = object()

    def failing(*, context: Any, **_: Any) -> torch.Tensor:
        assert context is marker
        raise ValueError("processor failed")

    with pytest.raises(ValueError, match="processor failed"):
        model(batch.input_ids, batch.position_ids, batch.attention_mask, output_processor=failing,
              output_processor_context=marker)
    assert "_postprocess" not in vars(model)
    logits = model(batch.input_ids, batch.position_ids, batch.attention_mask)
    assert logits.shape[-1] == 128  # upstream's postprocess again
