"""Self-check of ``megatron.moe_recompute_release``: after a step with ``recompute_granularity='full'``
nothing of the recomputed forward stays reachable from the model.
"""

from __future__ import annotations

import contextlib

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import megatron_on


def check_moe_recompute_release(context: CheckContext) -> None:
    """After a step with ``recompute_granularity='full'`` nothing of the recomputed forward stays reachable.

    A tiny MoE GPT, each dispatcher that runs on one CPU rank (all-to-all, all-gather): after forward
    and backward no tensor with autograd history may be reachable from the model (upstream keeps
    the dispatcher's probs, and through them each checkpoint's input and its gradient), the
    dispatchers may hold none of the step's probs, routing maps and permutation mappings, and the
    model may hold no more bytes than the same model trained without recompute. The flex dispatcher
    is not checked here: DeepEP needs two ranks (TPxEP > 1) and the CUDA-only ``deep_ep`` library
    (the tests run it on two CPU ranks with its buffers stood in).
    """
    from ..._checks._cpu_stand_in import cpu_moe
    from .._moe_recompute_release import ALLGATHER_STEP_TENSORS, ALLTOALL_STEP_TENSORS
    from ._moe_recompute_probe import build_moe_gpt, step_tensors, train_step

    released = {"alltoall": ALLTOALL_STEP_TENSORS, "allgather": ALLGATHER_STEP_TENSORS}

    device = context.device
    with megatron_on(device), cpu_moe() if device == "cpu" else contextlib.nullcontext():
        for dispatcher in ("alltoall", "allgather"):
            model = build_moe_gpt(dispatcher, recompute=True).to(device)
            recomputed = train_step(model, device).held
            expect(not recomputed.with_history, f"after backward with full recompute ({dispatcher} dispatcher) "
                   "no tensor with autograd history is reachable from the model (holders)", [],
                   recomputed.holders())
            kept = sorted(f"{layer}.{name}" for layer, names in step_tensors(model).items() for name in names
                          if name.removeprefix("token_dispatcher.") in released[dispatcher])
            expect(not kept, f"after the step the {dispatcher} dispatchers hold none of its probs, routing maps "
                   "and permutation mappings (kept)", [], kept)
            plain = train_step(build_moe_gpt(dispatcher, recompute=False).to(device), device).held
            expect(recomputed.bytes <= plain.bytes, f"with full recompute ({dispatcher} dispatcher) the model "
                   "holds no more after backward than without recompute (bytes)", f"<= {plain.bytes}",
                   recomputed.bytes)
