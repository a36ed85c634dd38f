"""Self-check of ``vllm.nvfp4_marlin_w4a16``: an NVFP4 checkpoint served as W4A16 on vLLM's Marlin kernel."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

from .._nvfp4_checkpoint import (
    DOWN,
    UP,
    Bf16Linears,
    dequantize,
    items,
    kernel_name,
    linear_checkpoint,
    process_weights_after_loading,
)

MARLIN = "MarlinNvFp4LinearKernel"


def check_nvfp4_marlin_w4a16(context: CheckContext) -> None:
    """Layers of an NVFP4 (W4A4) checkpoint run vLLM's W4A16 Marlin kernel and load the W4A4-shaped checkpoint.

    Built as vLLM builds them from ``hf_quant_config`` ``quant_algo: NVFP4``. On CPU, Marlin's CUDA
    repack is stood in (``_cpu_stand_in.cpu_marlin_layout``) and no Marlin forward can run; on CUDA
    the layers' output must also equal the W4A16 product (bf16 activations times the dequantised
    weight), which activation quantisation (W4A4) would not give.
    """
    from ._cpu_stand_in import cpu_marlin_layout, vllm_context

    device = context.device
    # A W4A4 checkpoint: with activation scales, which W4A16 loads and then drops.
    weights = {**linear_checkpoint(UP, seed=1, out_features=64, in_features=128, weight_scale_2=0.01, input_scale=1.0),
               **linear_checkpoint(DOWN, seed=2, out_features=128, in_features=64, weight_scale_2=0.02,
                                   input_scale=1.0)}
    with vllm_context(device), cpu_marlin_layout() if device == "cpu" else contextlib.nullcontext():
        with torch.device(device):
            model: Any = Bf16Linears("NVFP4")
        kernels = {name: kernel_name(getattr(model, name)) for name in (UP, DOWN)}
        expect(kernels == dict.fromkeys(kernels, MARLIN), "layers of an NVFP4 (W4A4) checkpoint run vLLM's W4A16 "
               "Marlin kernel (16-bit activations)", dict.fromkeys(kernels, MARLIN), kernels)
        try:
            model.load_weights(items({k: v.to(device) for k, v in weights.items()}))
            process_weights_after_loading(model)
        except Exception as exc:
            found = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            raise SelfCheckFailed("the W4A16 layers load and process an NVFP4 checkpoint with activation scales",
                                  "loaded", found) from exc
        if device != "cuda":
            return
        for name, in_features in ((UP, 128), (DOWN, 64)):
            x = torch.randn(8, in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            w = dequantize(*(weights[f"{name}.{part}"] for part in ("weight", "weight_scale", "weight_scale_2")))
            reference = x.float() @ w.T
            out = getattr(model, name)(x.to(device))[0].float().cpu()
            error = float((out - reference).abs().max() / reference.abs().max())
            expect(error <= 2e-2, f"{name} serves the W4A16 product (largest difference relative to the largest "
                   "output; bf16 rounding)", "<= 2e-2", f"{error:.3g}")
