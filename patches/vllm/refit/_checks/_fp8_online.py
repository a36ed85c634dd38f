"""Online-FP8 models of vLLM's own layers and their bf16 checkpoints, for the ``vllm.fp8_online_refit``
self-check and tests/vllm/test_fp8_online_refit.py.

Online FP8 is a bf16 checkpoint that vLLM quantises at load (``Fp8Config`` without an FP8-serialised
checkpoint, or ``OnlineQuantizationConfig`` with ``fp8_per_tensor``): what a refit pushes is bf16, as RL
frameworks train it. ``OnlineFp8Linears``: a fused ``gate_up`` (``MergedColumnParallelLinear``, two shards
of 128 x 256) and a ``down`` (``RowParallelLinear``, 128 -> 256); ``OnlineFp8Moe``: one fused-MoE layer of
4 experts built by vLLM's factory. Checkpoint names are a model's (``gate.weight``,
``experts.<e>.gate_proj.weight``...), written by each parameter's ``weight_loader`` with its shard id, as
vLLM models' ``load_weights`` do.

The shards and experts are drawn at different magnitudes, so each has its own amax and the scale vLLM
derives from it is not shared by accident.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ..._checks._gate_up_down import GateUpDown
from ..._checks._tiny_moe import OneMoeLayer

HIDDEN, INTERMEDIATE = 256, 128
EXPERTS = 4


def fp8_config_quantises_online() -> bool:
    """Whether this vLLM's ``Fp8Config`` quantises a bf16 checkpoint itself (0.24-0.29; 0.33 moved online
    FP8 to ``OnlineQuantizationConfig`` and builds ``Fp8LinearMethod`` whatever the checkpoint)."""
    import inspect

    from vllm.model_executor.layers.quantization.fp8 import Fp8Config

    return "is_checkpoint_fp8_serialized" in inspect.getsource(Fp8Config.get_quant_method)


def online_fp8_config(kind: str) -> Any:
    """A config that has vLLM quantise a bf16 checkpoint per tensor at load: ``kind`` ``"fp8"``,
    ``Fp8Config`` without an FP8-serialised checkpoint (what ``quantization="fp8"`` makes of a bf16 model,
    0.24-0.29); ``"online"``, ``OnlineQuantizationConfig`` with ``fp8_per_tensor`` (0.24+)."""
    if kind == "fp8":
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        return Fp8Config(is_checkpoint_fp8_serialized=False)
    from vllm.config.quantization import QuantizationConfigArgs
    from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig

    return OnlineQuantizationConfig(QuantizationConfigArgs(linear="fp8_per_tensor", moe="fp8_per_tensor"))


def config_kinds() -> tuple[str, ...]:
    """The online-FP8 configs this vLLM has (:func:`online_fp8_config`)."""
    return ("fp8", "online") if fp8_config_quantises_online() else ("online",)


class OnlineFp8Linears(GateUpDown):
    def __init__(self, kind: str = "online") -> None:
        super().__init__(online_fp8_config(kind), hidden=HIDDEN, intermediate=INTERMEDIATE)


class OnlineFp8Moe(OneMoeLayer):
    def __init__(self, kind: str = "online") -> None:
        super().__init__(online_fp8_config(kind), hidden=HIDDEN, intermediate=INTERMEDIATE, experts=EXPERTS,
                         name="fp8_online_moe")


def _bf16(generator: torch.Generator, out: int, inp: int, magnitude: float) -> torch.Tensor:
    return (torch.randn(out, inp, generator=generator) * magnitude).to(torch.bfloat16)


def linear_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "gate.weight": _bf16(generator, INTERMEDIATE, HIDDEN, 0.02),
        "up.weight": _bf16(generator, INTERMEDIATE, HIDDEN, 0.05),
        "down.weight": _bf16(generator, HIDDEN, INTERMEDIATE, 0.03),
    }


def moe_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for expert in range(EXPERTS):
        for proj, (out, inp) in (("gate_proj", (INTERMEDIATE, HIDDEN)), ("up_proj", (INTERMEDIATE, HIDDEN)),
                                 ("down_proj", (HIDDEN, INTERMEDIATE))):
            tensors[f"experts.{expert}.{proj}.weight"] = _bf16(generator, out, inp, 0.01 * (expert + 1))
    return tensors


MODELS = {"linear": OnlineFp8Linears, "moe": OnlineFp8Moe}
CHECKPOINTS = {"linear": linear_checkpoint, "moe": moe_checkpoint}


def items(weights: dict[str, torch.Tensor], device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    return iter([(name, tensor.to(device)) for name, tensor in weights.items()])


def first_load(kind: str, config: str, weights: dict[str, torch.Tensor], device: str = "cpu") -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders (which quantise once a layer is loaded), its
    processing. Online FP8 reads the model's dtype, which the self-checks' vLLM config lacks: bf16 there."""
    from ..._checks._cpu_stand_in import model_config_fields
    from ..._nvfp4_checkpoint import process_weights_after_loading

    with torch.device(device), model_config_fields(dtype=torch.bfloat16):
        model = MODELS[kind](config)
    model.load_weights(items(weights, device))
    process_weights_after_loading(model)
    return model
