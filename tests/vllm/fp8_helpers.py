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

import itertools
from collections.abc import Iterable, Iterator

import torch

BLOCK = 128
HIDDEN, INTERMEDIATE = 256, 128
EXPERTS = 4
_numbers = itertools.count()  # vLLM registers MoE layers by prefix in the process-wide context


def fp8_config(block: bool) -> object:
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    if block:
        return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="dynamic",
                         weight_block_size=[BLOCK, BLOCK])
    return Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")


class Fp8Linears(torch.nn.Module):
    def __init__(self, block: bool) -> None:
        from vllm.model_executor.layers.linear import MergedColumnParallelLinear, RowParallelLinear

        super().__init__()
        self.block = block
        config = fp8_config(block)
        self.gate_up = MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2, bias=False, quant_config=config,
                                                  prefix="gate_up", params_dtype=torch.bfloat16)
        self.down = RowParallelLinear(HIDDEN, INTERMEDIATE, bias=False, quant_config=config, prefix="down",
                                      params_dtype=torch.bfloat16)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """``gate.*``/``up.*`` into the fused ``gate_up`` shards 0/1, ``down.*`` as is (vLLM's stacking)."""
        loaded = set()
        for name, tensor in weights:
            prefix, _, suffix = name.partition(".")
            if prefix in ("gate", "up"):
                param = self.get_parameter(f"gate_up.{suffix}")
                param.weight_loader(param, tensor, ("gate", "up").index(prefix))
            else:
                param = self.get_parameter(name)
                param.weight_loader(param, tensor)
            loaded.add(name)
        return loaded


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


class Fp8Moe(torch.nn.Module):
    def __init__(self, block: bool) -> None:
        from vllm.model_executor.layers import fused_moe

        super().__init__()
        factory = getattr(fused_moe, "FusedMoEFactory", None) or fused_moe.FusedMoE  # 0.25+ / 0.24
        self.experts = factory(
            num_experts=EXPERTS, top_k=2, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
            params_dtype=torch.bfloat16, quant_config=fp8_config(block),
            prefix=f"patchkit_fp8_moe{next(_numbers)}.experts", tp_size=1, dp_size=1, pcp_size=1,
        )

    @property
    def routed(self) -> torch.nn.Module:
        return getattr(self.experts, "routed_experts", self.experts)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """vLLM's expert mapping, as a MoE model's ``load_weights`` (``_tiny_moe.load_by_expert_mapping``)."""
        from patchkit.patches.vllm._checks._tiny_moe import load_by_expert_mapping

        return load_by_expert_mapping(self, weights, EXPERTS)


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
