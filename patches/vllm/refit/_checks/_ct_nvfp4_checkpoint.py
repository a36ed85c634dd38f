"""Compressed-tensors NVFP4 models and checkpoints of vLLM's own layers and loaders, for the
``vllm.compressed_tensors_nvfp4_refit`` self-check and tests/vllm.

The quantization config is vLLM's ``CompressedTensorsConfig.from_config`` of a ``config.json``
``quantization_config`` as llm-compressor writes it for ``format: nvfp4-pack-quantized``: weights
4-bit float, ``tensor_group`` strategy, group 16; activations the same (W4A4, ``NVFP4``) or none
(W4A16, ``NVFP4A16``). vLLM builds ``CompressedTensorsLinearMethod`` with the scheme
``CompressedTensorsW4A4Fp4`` on ``layer.scheme`` (``use_a16`` for W4A16) and, for fused MoE,
``CompressedTensorsW4A4Nvfp4MoEMethod``.

Checkpoint tensors per layer (llm-compressor's names): ``weight_packed`` (uint8, two E2M1 values per
byte), ``weight_scale`` (E4M3, one per 16 inputs), ``weight_global_scale`` (float32, one per layer,
stored as the divisor: vLLM takes its reciprocal) and, for W4A4, ``input_global_scale``.

``CtLinears`` is a fused ``gate_up`` (two shards) and a ``down``, loaded by each parameter's
``weight_loader`` with its shard id as vLLM models do; ``CtMoe`` is one fused-MoE layer built by vLLM's
factory and loaded through vLLM's expert mapping. On CPU, W4A4 linear layers get vLLM's emulation
kernel and MoE layers its emulation backend (``cpu_nvfp4_kernels``); W4A16 linear layers need
``cpu_marlin_layout`` (Marlin's CUDA repack stood in). ``hidden``/``intermediate`` default to the
self-check's tiny sizes; the GPU tests pass sizes Marlin's kernels take (inputs a multiple of 128).
"""

from __future__ import annotations

import torch

from ..._checks._gate_up_down import GateUpDown
from ..._checks._tiny_moe import OneMoeLayer
from ..._nvfp4_checkpoint import random_nvfp4

HIDDEN, INTERMEDIATE, EXPERTS = 128, 64, 4


#: a ``kv_cache_scheme`` as llm-compressor writes it for an FP8 KV cache with static per-tensor scales
FP8_KV_CACHE = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def ct_nvfp4_config(a16: bool, kv_cache_scheme: dict[str, object] | None = None) -> object:
    """vLLM's compressed-tensors config for an NVFP4 (W4A4) or NVFP4A16 (W4A16) checkpoint."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    fp4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
           "dynamic": False}
    activations = None if a16 else {**fp4, "dynamic": "local"}
    return CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": [],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": fp4, "input_activations": activations}},
        "kv_cache_scheme": kv_cache_scheme,
    })


class CtLinears(GateUpDown):
    """A fused ``gate_up`` (``MergedColumnParallelLinear``) and a ``down`` (``RowParallelLinear``)."""

    def __init__(self, a16: bool, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> None:
        super().__init__(ct_nvfp4_config(a16), hidden=hidden, intermediate=intermediate)


def _layer(generator: torch.Generator, prefix: str, out: int, inp: int, a16: bool,
           global_scale: float) -> dict[str, torch.Tensor]:
    weight, weight_scale = random_nvfp4(generator, out, inp)
    tensors = {
        f"{prefix}.weight_packed": weight,
        f"{prefix}.weight_scale": weight_scale,
        f"{prefix}.weight_global_scale": torch.tensor([global_scale]),
    }
    if not a16:
        tensors[f"{prefix}.input_global_scale"] = torch.tensor([global_scale * 4])
    return tensors


def linear_checkpoint(a16: bool, seed: int, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE
                      ) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    scale = 100.0 * (1 + seed)
    return {
        **_layer(generator, "gate", intermediate, hidden, a16, scale),
        **_layer(generator, "up", intermediate, hidden, a16, scale),  # fused shards share their global scale
        **_layer(generator, "down", hidden, intermediate, a16, scale * 2),
    }


class CtMoe(OneMoeLayer):
    """One fused-MoE layer of ``EXPERTS`` experts with the compressed-tensors NVFP4 config."""

    def __init__(self, a16: bool, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> None:
        super().__init__(ct_nvfp4_config(a16), hidden=hidden, intermediate=intermediate, experts=EXPERTS,
                         name="ct_moe")


def moe_checkpoint(a16: bool, seed: int, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE
                   ) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for expert in range(EXPERTS):
        scale = 100.0 * (1 + seed) * (expert + 1)
        for proj, (out, inp) in (("gate_proj", (intermediate, hidden)), ("up_proj", (intermediate, hidden)),
                                 ("down_proj", (hidden, intermediate))):
            layer = _layer(generator, f"experts.{expert}.{proj}", out, inp, a16, scale)
            # vLLM's MoE loader takes per-expert scalars for the global scales
            tensors.update({k: v.reshape(()) if v.numel() == 1 else v for k, v in layer.items()})
    return tensors
