"""Self-check of ``megatron.mtp_postprocess``: Forward with labels returns main-head logits, and the MTP layers
still get gradient.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import forward, megatron_on
from ..._checks._tiny_gpt import BATCH_SIZE, SEQ_LEN, VOCAB_SIZE, build_tiny_gpt, make_batch


def check_mtp_postprocess(context: CheckContext) -> None:
    """Forward with labels returns main-head logits, and the MTP layers still get gradient."""
    from .._options import default_options

    options = default_options()
    with megatron_on(context.device):
        model = build_tiny_gpt(mtp_num_layers=1).to(context.device)
        output = forward(model, make_batch().to(context.device))
        if options.returns == "loss":  # configured to return upstream's LM loss [batch, seq]
            expected: tuple[int, ...] = (BATCH_SIZE, SEQ_LEN)
            what = "GPTModel.forward(labels=...) returns the LM loss [batch, seq] (returns='loss')"
        else:
            expected = (BATCH_SIZE, SEQ_LEN, VOCAB_SIZE)
            what = "GPTModel.forward(labels=...) returns main-head logits [batch, seq, vocab] when MTP is on"
        expect(tuple(output.shape) == expected, what, expected, tuple(output.shape))
        # Zero times the logits: only the MTP loss attached to the output carries gradient.
        (output.float().sum() * 0).backward()
        mtp_grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("mtp.")}
        moved = sorted(n for n, g in mtp_grads.items() if g is not None and bool(g.abs().sum() > 0))
        expect(bool(moved), "the MTP layers get gradient from the attached MTP loss",
               f"nonzero gradient in {len(mtp_grads)} MTP parameters", "none")
        if options.without_labels == "skip":  # the default
            model.zero_grad(set_to_none=True)
            forward(model, make_batch().to(context.device), labels=False).float().sum().backward()
            touched = sorted(n for n, p in model.named_parameters() if n.startswith("mtp.") and p.grad is not None)
            expect(not touched, "a forward without labels runs no MTP layer (MTP parameters with gradient)",
                   [], touched)
