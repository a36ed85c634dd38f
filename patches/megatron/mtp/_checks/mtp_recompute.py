"""Self-check of ``megatron.mtp_recompute``: With ``recompute_granularity='full'``, an MTP layer takes what RL
jobs give it and trains as without.
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from ..._checks._harness import first_line, megatron_on
from ..._checks._tiny_gpt import build_tiny_gpt


def check_mtp_recompute(context: CheckContext) -> None:
    """With ``recompute_granularity='full'``, an MTP layer takes what RL jobs give it and trains as without.

    Each input the installed release hands its MTP layer is tried: a non-tensor keyword through
    ``_checkpointed_forward(forward_func, ...)`` (0.14-0.17), packed sequences (``packed_seq_params``,
    where the release's MTP layer accepts them: 0.16+), a ``padding_mask`` (0.18+). The recomputed
    layer must run forward and backward and give its parameters the gradients the same layer gives
    without recompute. On 0.19+ (native) this shows upstream doing it.
    """
    from ._mtp_recompute_probe import (
        RECOMPUTE,
        checkpointed_call_grad,
        mtp_layer_grads,
        takes_forward_func,
        takes_padding_mask,
    )

    device = context.device
    with megatron_on(device):
        layer = build_tiny_gpt(mtp_num_layers=1, **RECOMPUTE).mtp.layers[0].to(device)
        if takes_forward_func(layer):
            try:
                grad = checkpointed_call_grad(layer, device)
            except Exception as exc:
                raise SelfCheckFailed("MultiTokenPredictionLayer._checkpointed_forward takes a non-tensor keyword "
                                      "(packed_seq_params)", "a checkpointed forward and backward",
                                      first_line(exc)) from exc
            expect(bool((grad == 3.0).all()), "the checkpointed function's gradient comes back through "
                   "_checkpointed_forward (d(3x)/dx)", 3.0, f"values in [{float(grad.min()):g}, {float(grad.max()):g}]")
        cases = {"packed sequences (packed_seq_params)": {"packed": True}}
        if takes_padding_mask(layer):
            cases["a padding_mask"] = {"padding_mask": True}
        for what, inputs in cases.items():
            try:
                plain = mtp_layer_grads(build_tiny_gpt(mtp_num_layers=1).to(device), device=device, **inputs)
            except AssertionError as exc:
                if "packing is not yet supported" in str(exc):
                    continue  # 0.14/0.15 refuse packed sequences in the MTP layer, recompute or not
                raise
            try:
                recomputed = mtp_layer_grads(build_tiny_gpt(mtp_num_layers=1, **RECOMPUTE).to(device),
                                             device=device, **inputs)
            except Exception as exc:
                raise SelfCheckFailed(f"a recomputed MTP layer runs forward and backward with {what}",
                                      "gradients for its parameters", first_line(exc)) from exc
            expect(recomputed.keys() == plain.keys() and bool(plain), f"the recomputed MTP layer with {what} "
                   "gives gradient to the parameters the plain layer does", sorted(plain), sorted(recomputed))
            difference = max(float((recomputed[n] - plain[n]).abs().max()) for n in plain)
            expect(difference <= 1e-5, f"the recomputed MTP layer with {what} gets the plain layer's gradients "
                   "(largest difference)", "<= 1e-5", f"{difference:.3g}")
