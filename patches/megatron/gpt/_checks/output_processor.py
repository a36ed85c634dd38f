"""Self-check of ``megatron.output_processor``: ``forward(output_processor=...)`` on a tiny GPT.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import first_line, forward, megatron_on
from ..._checks._tiny_gpt import BATCH_SIZE, SEQ_LEN, VOCAB_SIZE, Batch, build_tiny_gpt, make_batch


def check_output_processor(context: CheckContext) -> None:
    """``forward(output_processor=...)`` on a tiny GPT: the processor gets the hidden states and the
    output weight, the output layer never runs (no full logits), and its chunked log-probs equal those
    from upstream's full logits; with an MTP layer, the processor gets the main chunk and its log-probs
    equal upstream's per-token loss, negated."""
    from ._output_processor_probe import (
        LogProbContext,
        OutputLayerCalls,
        build_gpt,
        chunked_label_log_probs,
        label_log_probs_from_logits,
    )

    with megatron_on(context.device), torch.no_grad():
        model = build_gpt(True, SEQ_LEN, VOCAB_SIZE).to(context.device)
        batch = make_batch().to(context.device)
        expected = label_log_probs_from_logits(forward(model, batch, labels=False), batch.labels)
        seen = LogProbContext(chunk=4)
        calls = OutputLayerCalls(model)
        try:
            result = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                           output_processor=chunked_label_log_probs, output_processor_context=seen)
        except TypeError as exc:
            raise SelfCheckFailed("GPTModel.forward takes output_processor and output_processor_context",
                                  "the processor's result", first_line(exc)) from exc
        finally:
            calls.remove()
        expect(calls.count == 0, "with an output_processor the output layer never runs (no full logits)",
               0, calls.count)
        hidden = seen.received.get("hidden_states")
        shape = None if hidden is None else tuple(hidden.shape)
        expect(shape == (SEQ_LEN, BATCH_SIZE, 64), "the processor receives the decoder's hidden states "
               "[seq, batch, hidden]", (SEQ_LEN, BATCH_SIZE, 64), shape)
        expect(seen.received.get("output_weight") is model.shared_embedding_or_output_weight(),
               "the processor receives the tied output weight", "the shared embedding weight",
               type(seen.received.get("output_weight")).__name__)
        shape = tuple(getattr(result, "shape", ()))
        expect(shape == (BATCH_SIZE, SEQ_LEN), "forward returns the processor's result", (BATCH_SIZE, SEQ_LEN), shape)
        difference = float((result - expected).abs().max())
        expect(difference <= 1e-5, "chunked log-probs equal those from the full logits (max difference)",
               "<= 1e-5", f"{difference:.3g}")
        _check_with_mtp(context.device, batch)


def _check_with_mtp(device: str, batch: Batch) -> None:
    """0.18's processor branch with an MTP layer in the stage (eval mode: nothing logged to the MTP tracker)."""
    from ...mtp import disable as leave_mtp_to_upstream
    from ._output_processor_probe import LogProbContext, chunked_label_log_probs

    model = build_tiny_gpt(mtp_num_layers=1).to(device).eval()
    # Upstream runs the MTP block and returns the per-token LM loss; megatron.mtp_postprocess, if on,
    # would return logits instead, so this model is left to upstream's postprocess.
    leave_mtp_to_upstream(model)
    expected = -forward(model, batch)
    seen = LogProbContext(chunk=4)
    try:
        result = model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels,
                       loss_mask=batch.loss_mask,
                       output_processor=chunked_label_log_probs, output_processor_context=seen)
    except Exception as exc:
        raise SelfCheckFailed("forward(output_processor=...) runs on a model with MTP layers",
                              "the processor's result", first_line(exc)) from exc
    hidden = seen.received.get("hidden_states")
    shape = None if hidden is None else tuple(hidden.shape)
    expect(shape == (SEQ_LEN, BATCH_SIZE, 64), "with MTP the processor receives the main chunk [seq, batch, hidden]",
           (SEQ_LEN, BATCH_SIZE, 64), shape)
    difference = float((result - expected).abs().max())
    expect(difference <= 1e-5, "with MTP, log-probs equal upstream's per-token loss negated (max difference)",
           "<= 1e-5", f"{difference:.3g}")
