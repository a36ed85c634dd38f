"""ModelOpt MXFP8 models of vLLM's own layers and their checkpoints, for the ``vllm.mxfp8_refit`` self-check
and tests/vllm/test_mxfp8_refit.py.

``Mxfp8Linears``: a fused ``gate_up`` (``MergedColumnParallelLinear``, two shards of 64 x 128) and a
``down`` (``RowParallelLinear``, 64 -> 128) with ``ModelOptMxFp8Config``; ``Mxfp8Moe``: one fused-MoE
layer of 4 experts built by vLLM's factory with the same config. A checkpoint is what ModelOpt writes
for MXFP8: per layer an E4M3 ``weight`` and a uint8 E8M0 ``weight_scale`` (one per 32 inputs), under a
model's names (``gate.weight``, ``experts.<e>.gate_proj.weight``...), written by each parameter's
``weight_loader`` with its shard id, as vLLM models' ``load_weights`` do.

:func:`emulation_backends` stands in, on CPU only, for what selects a backend, nothing else:

- ``vllm.model_executor.kernels.linear._POSSIBLE_MXFP8_KERNELS[<CPU platform>]`` is set to
  ``[EmulationMxfp8LinearKernel]``. Upstream lists its emulation kernel (a dequantise-to-bf16 in
  torch) for CUDA and ROCm only, so on CPU ``init_mxfp8_linear_kernel`` finds no kernel. The kernel is
  vLLM's, unchanged; so is what it does to the layer.
- vLLM 0.24's MXFP8 MoE oracle offers its EMULATION backend on ROCm only (0.29+ list it for every
  device and select it on CPU themselves): ``modelopt.select_mxfp8_moe_backend`` answers EMULATION with
  vLLM's ``Mxfp8EmulationTritonExperts`` where upstream's finds no backend. The conversion
  (``convert_to_fp8_moe_kernel_format``) and the load-time dequantisation to bf16 are upstream's.

No forward runs (the emulation MoE forward needs Triton): what a layer serves is read from its kernel
tensors, compared bit for bit with vLLM's own first load of the same checkpoint.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..._checks._gate_up_down import GateUpDown
from ..._checks._tiny_moe import OneMoeLayer

BLOCK = 32
HIDDEN, INTERMEDIATE = 128, 64
EXPERTS = 4


def has_linear_method() -> bool:
    """Whether this vLLM has ``ModelOptMxFp8LinearMethod`` (0.16-0.29)."""
    from vllm.model_executor.layers.quantization import modelopt

    return hasattr(modelopt, "ModelOptMxFp8LinearMethod")


def mxfp8_config() -> Any:
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMxFp8Config

    return ModelOptMxFp8Config(is_checkpoint_mxfp8_serialized=True, kv_cache_quant_algo=None, exclude_modules=[])


@contextlib.contextmanager
def emulation_backends(device: str) -> Iterator[None]:
    """vLLM's MXFP8 emulation kernels selected on CPU (module docstring); on another device, nothing."""
    if device != "cpu":
        yield
        return
    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.model_executor.kernels.linear.mxfp8.emulation import EmulationMxfp8LinearKernel
    from vllm.model_executor.layers.quantization import modelopt
    from vllm.platforms import current_platform

    table = linear_kernels._POSSIBLE_MXFP8_KERNELS
    # 0.24's kernel module keeps the platform resolved at its import: register for that one too.
    enums = {current_platform._enum, getattr(linear_kernels, "current_platform", current_platform)._enum}
    saved_table = {platform: table.get(platform) for platform in enums}
    saved_select = modelopt.select_mxfp8_moe_backend
    for platform in enums:
        table[platform] = [EmulationMxfp8LinearKernel]
    modelopt.select_mxfp8_moe_backend = _with_emulation_fallback(saved_select)
    try:
        yield
    finally:
        modelopt.select_mxfp8_moe_backend = saved_select
        for platform, saved in saved_table.items():
            if saved is None:
                table.pop(platform, None)
            else:
                table[platform] = saved


def _with_emulation_fallback(select: Any) -> Any:
    def select_mxfp8_moe_backend(config: Any) -> Any:
        try:
            return select(config=config)
        except ValueError:  # "No MXFP8 MoE backends available." (0.24 on CPU)
            from vllm.model_executor.layers.fused_moe.experts.mxfp8_emulation_moe import (
                Mxfp8EmulationTritonExperts,
            )
            from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend

            return Fp8MoeBackend.EMULATION, Mxfp8EmulationTritonExperts

    return select_mxfp8_moe_backend


class Mxfp8Linears(GateUpDown):
    def __init__(self, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> None:
        super().__init__(mxfp8_config(), hidden=hidden, intermediate=intermediate)


class Mxfp8Moe(OneMoeLayer):
    def __init__(self, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> None:
        super().__init__(mxfp8_config(), hidden=hidden, intermediate=intermediate, experts=EXPERTS, name="mxfp8_moe")


MODELS: dict[str, type[torch.nn.Module]] = {"linear": Mxfp8Linears, "moe": Mxfp8Moe}


def _layer(generator: torch.Generator, prefix: str, out: int, inp: int) -> dict[str, torch.Tensor]:
    """Finite E4M3 values (|x| <= 448) and E8M0 exponents around 2^0 (255 would be NaN)."""
    weight = (torch.randn(out, inp, generator=generator) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = torch.randint(117, 137, (out, inp // BLOCK), generator=generator, dtype=torch.uint8)
    return {f"{prefix}.weight": weight, f"{prefix}.weight_scale": scale}


def checkpoint(kind: str, seed: int, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> dict[str, torch.Tensor]:
    """A random ModelOpt MXFP8 checkpoint for :data:`MODELS` ``[kind]`` (built with the same sizes)."""
    generator = torch.Generator().manual_seed(seed)
    if kind == "linear":
        return {
            **_layer(generator, "gate", intermediate, hidden),
            **_layer(generator, "up", intermediate, hidden),
            **_layer(generator, "down", hidden, intermediate),
        }
    tensors: dict[str, torch.Tensor] = {}
    for expert in range(EXPERTS):
        for proj, (out, inp) in (("gate_proj", (intermediate, hidden)), ("up_proj", (intermediate, hidden)),
                                 ("down_proj", (hidden, intermediate))):
            tensors.update(_layer(generator, f"experts.{expert}.{proj}", out, inp))
    return tensors


def items(weights: dict[str, torch.Tensor], device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    return iter([(name, tensor.to(device)) for name, tensor in weights.items()])


def first_load(kind: str, weights: dict[str, torch.Tensor], device: str = "cpu") -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders, its processing (inside :func:`emulation_backends`)."""
    from ..._nvfp4_checkpoint import process_weights_after_loading

    with torch.device(device):
        model = MODELS[kind]()
    model.load_weights(items(weights, device))
    process_weights_after_loading(model)
    return model
