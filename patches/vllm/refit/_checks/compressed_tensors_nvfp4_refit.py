"""Self-checks of ``vllm.compressed_tensors_nvfp4_refit`` and ``vllm.compressed_tensors_nvfp4_moe_refit``:
compressed-tensors NVFP4 checkpoints refitted into vLLM's own compressed-tensors NVFP4 (W4A4) linear
layers, and into one NVFP4 fused-MoE layer.

vLLM's ``MergedColumnParallelLinear``/``RowParallelLinear`` with ``CompressedTensorsConfig`` for an
``nvfp4-pack-quantized`` checkpoint (``_ct_nvfp4_checkpoint``) are loaded through their weight loaders
and processed by upstream's ``process_weights_after_loading``; a second checkpoint is refitted through
``patchkit.patches.vllm.refit``, then the first again. Each time every kernel tensor must equal, bit
for bit, what vLLM's own first load of that checkpoint into a fresh model produces, in the same tensor
objects and storage (which CUDA graphs hold). On CPU, vLLM's NVFP4 emulation kernel is listed for the
platform (``_cpu_stand_in``); on CUDA the kernel vLLM selects runs.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._nvfp4_checkpoint import items, process_weights_after_loading
from ._round_trip import differing, kernel_bytes, refit_steps


def _first_load(kind: str, checkpoint: dict[str, torch.Tensor], device: str) -> Any:
    from ._ct_nvfp4_checkpoint import CtLinears, CtMoe

    with torch.device(device):  # where vLLM's loader builds layers
        model = CtLinears(a16=False) if kind == "linear" else CtMoe(a16=False)
    model.load_weights(items({k: v.to(device) for k, v in checkpoint.items()}))
    process_weights_after_loading(model)
    return model


def check_compressed_tensors_nvfp4_refit(context: CheckContext) -> None:
    """Load, refit a second checkpoint, refit back: each time the linear layers equal vLLM's own first load of it."""
    _check(context, "linear")


def check_compressed_tensors_nvfp4_moe_refit(context: CheckContext) -> None:
    """The same for one fused-MoE layer."""
    _check(context, "moe")


def _check(context: CheckContext, kind: str) -> None:
    from ..._checks._cpu_stand_in import vllm_context
    from ._ct_nvfp4_checkpoint import linear_checkpoint, moe_checkpoint

    device = context.device
    make = linear_checkpoint if kind == "linear" else moe_checkpoint
    first, second = make(False, seed=1), make(False, seed=2)
    with vllm_context(device):
        model = _first_load(kind, first, device)

        def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
            wrong = differing(model, kernel_bytes(_first_load(kind, weights, device)))
            expect(not wrong, f"after the {step} every kernel tensor equals vLLM's own first load of that "
                   "checkpoint (bit for bit)", "all of them", wrong)

        refit_steps(model, f"vLLM's compressed-tensors NVFP4 {kind} layers",
                    (("refit with a second checkpoint", second), ("refit back", first)),
                    load=lambda weights: model.load_weights(items({k: v.to(device) for k, v in weights.items()})),
                    verify=verify)
