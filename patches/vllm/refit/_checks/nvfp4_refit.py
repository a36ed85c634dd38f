"""Self-check of ``vllm.nvfp4_refit``: an export -> refit round trip through vLLM's own ModelOpt NVFP4
linear layers.

Two vLLM ``ColumnParallelLinear``/``RowParallelLinear`` layers with ``ModelOptNvFp4Config`` are loaded
through vLLM's ``AutoWeightsLoader`` and processed by upstream's ``process_weights_after_loading``; float
weights are then exported to the NVFP4 checkpoint format (as a QAT export writes it) and refitted
through ``patchkit.patches.vllm.refit``. The layers must serve exactly the exported weights (against a
dequantiser that does not use vLLM), keep their kernel tensors (same objects and storage, which
CUDA graphs and the engine hold), and serve the first weights again after a second refit. On CPU,
vLLM's own NVFP4 emulation kernel runs (``_cpu_stand_in``).
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._nvfp4_checkpoint import (
    DOWN,
    UP,
    TwoLinears,
    exact_activations,
    export_nvfp4,
    items,
    linear_reference,
    process_weights_after_loading,
    weights_a,
)
from ..._nvfp4_marlin_w4a16 import as_checkpoint_says
from ._round_trip import refit_steps

IN_FEATURES = {UP: 64, DOWN: 32}


def exported_weights(seed: int = 11) -> dict[str, torch.Tensor]:
    """Float weights of both layers (four decades of magnitude), exported to NVFP4 checkpoint tensors."""
    generator = torch.Generator().manual_seed(seed)
    up = torch.randn(32, 64, generator=generator) * torch.logspace(-2, 0, 64)
    down = torch.randn(64, 32, generator=generator) * 0.05
    return {**export_nvfp4(UP, up), **export_nvfp4(DOWN, down)}


def _largest_error(model: TwoLinears, weights: dict[str, torch.Tensor], device: str) -> float:
    worst = 0.0
    for name, in_features in IN_FEATURES.items():
        x = exact_activations(5, in_features)
        out, _ = getattr(model, name)(x.to(device))
        worst = max(worst, float((out.float().cpu() - linear_reference(weights, name, x)).abs().max()))
    return worst


def _kernel_tensors(model: TwoLinears) -> dict[str, tuple[int, int]]:
    return {f"{layer}.{name}": (id(p), p.data_ptr()) for layer in IN_FEATURES
            for name, p in getattr(model, layer).named_parameters()}


def check_nvfp4_refit(context: CheckContext) -> None:
    """Load, refit with exported weights, refit back: each time the layers serve exactly the weights given."""
    from ..._checks._cpu_stand_in import vllm_context

    first, exported = weights_a(), exported_weights()  # on the CPU, from CPU generators
    with vllm_context(context.device):
        # W4A4 layers, as the checkpoint says, even where vllm.nvfp4_marlin_w4a16 is on in this process.
        with torch.device(context.device), as_checkpoint_says():  # the device: where vLLM's loader builds layers
            model: Any = TwoLinears()
        model.load_weights(items(first))
        process_weights_after_loading(model)
        error = _largest_error(model, first, context.device)
        expect(error <= 1e-4, "the first load serves the checkpoint's weights (largest output difference)",
               "<= 1e-4", f"{error:.3g}")

        def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
            error = _largest_error(model, weights, context.device)
            expect(error <= 1e-4, f"after the {step} the layers serve the new weights (largest output difference "
                   "from the reference dequantiser)", "<= 1e-4", f"{error:.3g}")

        refit_steps(model, "vLLM's NVFP4 linear layers",
                    (("refit with exported weights", exported), ("refit back", first)),
                    load=lambda weights: model.load_weights(items(weights)), verify=verify, identities=_kernel_tensors)
