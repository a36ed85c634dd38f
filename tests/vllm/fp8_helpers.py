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

from collections.abc import Iterator

import torch
from patchkit.patches.vllm._checks._gate_up_down import GateUpDown
from patchkit.patches.vllm._checks._tiny_moe import OneMoeLayer

BLOCK = 128
HIDDEN, INTERMEDIATE = 256, 128
EXPERTS = 4


def fp8_config(block: bool) -> object:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    if block:
        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                         weight_block_size=[BLOCK, BLOCK])
    return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")


class Fp8Linears(GateUpDown):
    def __init__(self, block: bool) -> None:
        super().__init__(fp8_config(block), hidden=HIDDEN, intermediate=INTERMEDIATE, down=(HIDDEN, INTERMEDIATE))
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
