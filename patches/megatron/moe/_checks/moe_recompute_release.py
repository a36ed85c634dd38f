"""Self-check of ``megatron.moe_recompute_release``: after a step with ``recompute_granularity='full'``
nothing of the recomputed forward stays reachable from the model.
"""

from __future__ import annotations

import contextlib

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import megatron_on


def check_moe_recompute_release(context: CheckContext) -> None:
    """After a step with ``recompute_granularity='full'`` nothing of the recomputed forward stays reachable.

    A tiny MoE GPT, each dispatcher the release runs on CPU (all-to-all, all-gather): after forward
    and backward no tensor with autograd history may be reachable from the model (upstream keeps
    the dispatcher's probs, and through them each checkpoint's input and its gradient), and the
    model may hold no more bytes than the same model trained without recompute.
    """
    from ..._checks._cpu_stand_in import cpu_moe
    from ._moe_recompute_probe import build_moe_gpt, train_step

    device = context.device
    with megatron_on(device), cpu_moe() if device == "cpu" else contextlib.nullcontext():
        for dispatcher in ("alltoall", "allgather"):
            recomputed = train_step(build_moe_gpt(dispatcher, recompute=True).to(device), device).held
            expect(not recomputed.with_history, f"after backward with full recompute ({dispatcher} dispatcher) "
                   "no tensor with autograd history is reachable from the model (holders)", [],
                   recomputed.holders())
            plain = train_step(build_moe_gpt(dispatcher, recompute=False).to(device), device).held
            expect(recomputed.bytes <= plain.bytes, f"with full recompute ({dispatcher} dispatcher) the model "
                   "holds no more after backward than without recompute (bytes)", f"<= {plain.bytes}",
                   recomputed.bytes)
