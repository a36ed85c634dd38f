"""Self-check of ``megatron.mtp_detach_inputs``: The MTP loss sends no gradient into the embedding.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import forward, megatron_on
from ..._checks._tiny_gpt import build_tiny_gpt, make_batch


def check_mtp_detach_inputs(context: CheckContext) -> None:
    """The MTP loss sends no gradient into the embedding: it equals the one without any MTP loss."""
    with megatron_on(context.device):
        batch = make_batch().to(context.device)
        grads = []
        for scale in (0.1, 0.0):  # the same weights, with and without an MTP loss
            model = build_tiny_gpt(mtp_num_layers=1, mtp_loss_scaling_factor=scale).to(context.device)
            output = forward(model, batch)
            # With the postprocess patch the output is logits; either way only its sum matters.
            output.float().sum().backward()
            grads.append(model.embedding.word_embeddings.weight.grad.detach().clone())
        difference = float((grads[0] - grads[1]).abs().max())
        expect(difference <= 1e-6, "the MTP loss leaves the embedding's gradient unchanged (max difference)",
               "<= 1e-6", f"{difference:.3g}")
