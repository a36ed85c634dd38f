"""FP8 models and checkpoints for tests/vllm: vLLM's own FP8 layers, loaded through their weight loaders.

``Fp8Linears`` is a fused ``gate_up`` (``MergedColumnParallelLinear``, two shards of 128 x 256) and a
``down`` (``RowParallelLinear``, 256 -> 128) with ``Fp8Config``: per-tensor (static activation scales,
one weight scale per shard, which processing requantises to their largest) or block-wise (128 x 128
``weight_scale_inv``, dynamic activations). ``Fp8Moe`` is one fused-MoE layer of 4 experts built by
vLLM's factory with the same config. Checkpoint names are a model's (``gate.weight``,
``experts.<e>.gate_proj.weight``...), mapped onto the fused parameters and written by each parameter's
``weight_loader`` with its shard id, as vLLM models' ``load_weights`` do (the MoE mapping is
``_checks._tiny_moe.load_by_expert_mapping``, shared with the MoE self-checks). Processing needs the
harness's ``cpu_fp8_ops`` on CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from patchkit.patches.vllm._checks._gate_up_down import GateUpDown
from patchkit.patches.vllm._checks._tiny_moe import OneMoeLayer

BLOCK = 128
HIDDEN, INTERMEDIATE = 256, 128
EXPERTS = 4


def fp8_config(block: bool, e8m0_scales: bool = False) -> object:
    """``Fp8Config`` per tensor or per 128 x 128 block; ``e8m0_scales``: the block scales are E8M0
    (``float8_e8m0fnu``), set as vLLM's DeepSeek-V4 and Bailing-MoE configs set it (``is_scale_e8m0``)."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    if block:
        config = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                           weight_block_size=[BLOCK, BLOCK])
        if e8m0_scales:
            config.is_scale_e8m0 = True  # type: ignore[attr-defined]
        return config
    return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")


class Fp8Linears(GateUpDown):
    def __init__(self, block: bool, e8m0_scales: bool = False) -> None:
        super().__init__(fp8_config(block, e8m0_scales), hidden=HIDDEN, intermediate=INTERMEDIATE,
                         down=(HIDDEN, INTERMEDIATE))
        self.block = block


def _fp8(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """Random finite E4M3 values (|x| <= 448: every byte but the NaNs)."""
    return (torch.randn(*shape, generator=generator) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)


def _layer(generator: torch.Generator, prefix: str, out: int, inp: int, block: bool,
           scale: float) -> dict[str, torch.Tensor]:
    tensors = {f"{prefix}.weight": _fp8(generator, out, inp)}
    if block:
        tensors[f"{prefix}.weight_scale_inv"] = torch.rand(out // BLOCK, inp // BLOCK, generator=generator) * scale
    else:
        tensors[f"{prefix}.weight_scale"] = torch.tensor(scale * (1 + torch.rand(1, generator=generator).item()))
        tensors[f"{prefix}.input_scale"] = torch.tensor(0.5)
    return tensors


def linear_checkpoint(block: bool, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        **_layer(generator, "gate", INTERMEDIATE, HIDDEN, block, 0.01),
        **_layer(generator, "up", INTERMEDIATE, HIDDEN, block, 0.02),
        **_layer(generator, "down", INTERMEDIATE, HIDDEN, block, 0.03),
    }


class Fp8Moe(OneMoeLayer):
    def __init__(self, block: bool) -> None:
        super().__init__(fp8_config(block), hidden=HIDDEN, intermediate=INTERMEDIATE, experts=EXPERTS, name="fp8_moe")


def moe_checkpoint(block: bool, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for expert in range(EXPERTS):
        for proj, (out, inp) in (("gate_proj", (INTERMEDIATE, HIDDEN)), ("up_proj", (INTERMEDIATE, HIDDEN)),
                                 ("down_proj", (HIDDEN, INTERMEDIATE))):
            tensors.update(_layer(generator, f"experts.{expert}.{proj}", out, inp, block, 0.01 * (expert + 1)))
    return tensors


def items(checkpoint: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    return iter(list(checkpoint.items()))


def quantised_from_bf16(checkpoint: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A block-wise ``checkpoint``'s names and shapes, holding random bf16 weights quantised per 128 x 128 block
    with power-of-two scales, as NeMo-RL quantises for its refits (``cast_tensor_to_fp8_blockwise`` with
    ``pow2_weight_scaling_factors``: exponent ``ceil(log2(amax / 448))`` clamped to [-127, 127], scale 1.0
    for an all-zero block)."""
    generator = torch.Generator().manual_seed(seed)
    quantised = dict(checkpoint)
    for name, weight in checkpoint.items():
        if not name.endswith(".weight"):
            continue
        bf16 = (torch.randn(weight.shape, generator=generator) * 0.02).to(torch.bfloat16)
        quantised[name], quantised[name + "_scale_inv"] = _pow2_blockwise(bf16)
    return quantised


def _pow2_blockwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = weight.shape
    blocks = weight.float().reshape(rows // BLOCK, BLOCK, cols // BLOCK, BLOCK).permute(0, 2, 1, 3)
    amax = blocks.abs().amax(dim=(-1, -2), keepdim=True)
    exponent = (torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127) + 127).to(torch.uint8)
    scale = torch.where(exponent == 0, 1.0, torch.exp2(127 - exponent.float()))
    data = (blocks * scale).clamp(-448, 448).to(torch.float8_e4m3fn)
    return (data.permute(0, 2, 1, 3).reshape(rows, cols),
            torch.reciprocal(scale).reshape(rows // BLOCK, cols // BLOCK))


def with_e8m0_scales(checkpoint: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``checkpoint`` with its block scales as E8M0 (``float8_e8m0fnu``), each rounded up to a power of two
    first (exact for power-of-two scales)."""
    return {name: torch.exp2(torch.ceil(torch.log2(tensor))).to(torch.float8_e8m0fnu)
            if name.endswith("weight_scale_inv") else tensor for name, tensor in checkpoint.items()}


@contextlib.contextmanager
def bf16_model() -> Iterator[None]:
    """Build under bf16, as vLLM builds a model under its dtype (``set_default_torch_dtype``): the FP8 linear
    method takes its output dtype from it, and DeepGEMM's kernel serves bf16 only."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def deep_gemm_ue8m0(packed: bool = False) -> Iterator[None]:
    """vLLM's DeepGEMM UE8M0 processing on CPU (``vllm_cpu_harness.cpu_deep_gemm_e8m0``), with
    ``VLLM_USE_DEEP_GEMM=1`` (NeMo-RL's ``use_deep_gemm``: the fused-MoE oracle's DEEPGEMM backend)."""
    import vllm_cpu_harness

    previous = os.environ.get("VLLM_USE_DEEP_GEMM")
    os.environ["VLLM_USE_DEEP_GEMM"] = "1"
    try:
        with vllm_cpu_harness.cpu_deep_gemm_e8m0(packed=packed):
            yield
    finally:
        if previous is None:
            del os.environ["VLLM_USE_DEEP_GEMM"]
        else:
            os.environ["VLLM_USE_DEEP_GEMM"] = previous
