"""Self-check of ``vllm.mxfp4_moe_refit``: gpt-oss MXFP4 checkpoints refitted into vLLM's own MXFP4
fused-MoE layer on the MARLIN backend (``_round_trip`` drives it)."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, expect

from ._mxfp4_moe import GPT_OSS_HIDDEN, checkpoint, differing, first_load, kernel_bytes
from ._round_trip import kernel_identities, refit_steps

#: the self-check's layer: gpt-oss's hidden size and a small intermediate one, both padded on Marlin
#: (2880 -> 3072, 192 -> 256), so the check runs the padded path gpt-oss-20b/120b take
CHECK_SIZES = (GPT_OSS_HIDDEN, 192)


def check_mxfp4_moe_refit(context: CheckContext) -> None:
    """Load one gpt-oss MXFP4 checkpoint, refit another, refit back: each time the layer's kernel tensors
    equal vLLM's own first load of that checkpoint bit for bit, in the same tensor objects and storage.
    The layer has gpt-oss's hidden size (2880), which vLLM pads for Marlin."""
    from ..._checks._cpu_stand_in import vllm_context
    from ._mxfp4_moe import marlin_backend

    device = context.device
    first, second = checkpoint("gpt_oss", 1, *CHECK_SIZES), checkpoint("gpt_oss", 2, *CHECK_SIZES)
    with vllm_context(device), marlin_backend(device):
        try:
            model = first_load("gpt_oss", first, device, *CHECK_SIZES)
        except NotImplementedError as exc:  # vLLM's MXFP4 oracle found no backend here
            raise NeedsGPU(f"vLLM selects no MXFP4 MoE backend here ({str(exc)[:160]})") from exc
        backend = str(getattr(model.routed.quant_method.mxfp4_backend, "name", "?"))
        expect(backend == "MARLIN", "vLLM's gpt-oss MXFP4 MoE layer runs the MARLIN backend", "MARLIN", backend)
        loaded = {id(first): kernel_bytes(model)}

        def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
            if id(weights) not in loaded:
                loaded[id(weights)] = kernel_bytes(first_load("gpt_oss", weights, device, *CHECK_SIZES))
            wrong = differing(model, loaded[id(weights)])
            expect(not wrong, f"after the {step} the kernel tensors equal vLLM's own first load of that checkpoint",
                   "all of them, bit for bit", wrong)

        refit_steps(model, "vLLM's MXFP4 MoE layer",
                    (("refit with a second checkpoint", second), ("refit back", first)),
                    load=lambda weights: model.load_weights((k, v.to(device)) for k, v in weights.items()),
                    verify=verify, identities=lambda m: kernel_identities(m, buffers=False),
                    takes="the layer takes the new weights")
