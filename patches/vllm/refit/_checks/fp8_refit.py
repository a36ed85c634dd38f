"""Self-check of ``vllm.fp8_refit``: two FP8 checkpoints refitted into vLLM's own FP8 linear layers."""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, expect

from ..._nvfp4_checkpoint import items, process_weights_after_loading
from ._round_trip import kernel_identities, refit_steps


def check_fp8_refit(context: CheckContext) -> None:
    """Load one FP8 checkpoint, refit another, refit back: each time the layers' kernel tensors hold exactly
    that checkpoint (read without vLLM), in the same tensor objects and storage."""
    from ..._checks._cpu_stand_in import model_config_fields, vllm_context
    from ._fp8_checkpoint import Fp8TwoLinears, checkpoint, mismatches

    first, second = checkpoint(seed=1), checkpoint(seed=2)
    with vllm_context(context.device):
        try:
            # Fp8LinearMethod reads the model's dtype, and the check's vLLM config has no ModelConfig.
            with torch.device(context.device), model_config_fields(dtype=torch.float32):
                model: Any = Fp8TwoLinears()
        except (KeyError, ValueError) as exc:  # vLLM's FP8 kernel table has no kernel for this platform
            raise NeedsGPU(f"vLLM selects no FP8 linear kernel here ({str(exc)[:120]}); on vLLM 0.24's PyPI wheel "
                           "without CUDA, the CPU platform must be selected before vLLM is imported") from exc
        model.load_weights(items(first))
        process_weights_after_loading(model)
        wrong = mismatches(model, first)
        expect(not wrong, "vLLM's first load of an FP8 checkpoint serves it (kernel tensors)", "all of it", wrong)

        def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
            wrong = mismatches(model, weights)
            expect(not wrong, f"after the {step} the kernel tensors hold that checkpoint", "all of it", wrong)

        refit_steps(model, "vLLM's FP8 linear layers",
                    (("refit with a second checkpoint", second), ("refit back", first)),
                    load=lambda weights: model.load_weights(items(weights)), verify=verify,
                    identities=lambda m: kernel_identities(m, buffers=False))
