"""Self-check of ``vllm.mxfp8_refit``: ModelOpt MXFP8 checkpoints refitted into vLLM's own MXFP8 layers
(``_round_trip`` drives it)."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, expect

from ._round_trip import differing, kernel_bytes, refit_steps


def check_mxfp8_refit(context: CheckContext) -> None:
    """Load one MXFP8 checkpoint, refit another, refit back, into the fused-MoE layer and (vLLM 0.24-0.29)
    the linear layers: each time the kernel tensors equal vLLM's own first load of that checkpoint bit for
    bit, in the same tensor objects and storage."""
    from ..._checks._cpu_stand_in import vllm_context
    from ._mxfp8 import emulation_backends, has_linear_method

    with vllm_context(context.device), emulation_backends(context.device):
        for kind in ["moe", "linear"] if has_linear_method() else ["moe"]:
            _check(kind, context.device)


def _check(kind: str, device: str) -> None:
    from ._mxfp8 import checkpoint, first_load, items

    first, second = checkpoint(kind, seed=1), checkpoint(kind, seed=2)
    what = f"vLLM's ModelOpt MXFP8 {'fused-MoE layer' if kind == 'moe' else 'linear layers'}"
    try:
        model = first_load(kind, first, device)
    except ValueError as exc:  # no MXFP8 kernel or MoE backend for this device
        raise NeedsGPU(f"vLLM selects no MXFP8 {kind} kernel here ({str(exc)[:160]})") from exc
    loaded = {id(first): kernel_bytes(model)}

    def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
        if id(weights) not in loaded:
            loaded[id(weights)] = kernel_bytes(first_load(kind, weights, device))
        wrong = differing(model, loaded[id(weights)])
        expect(not wrong, f"after the {step} of {what} the kernel tensors equal vLLM's own first load of that"
               " checkpoint", "all of them, bit for bit", wrong)

    refit_steps(model, what, (("refit with a second checkpoint", second), ("refit back", first)),
                load=lambda weights: model.load_weights(items(weights, device)), verify=verify,
                takes="the layer takes the new weights")
