"""A two-layer FP8 model of vLLM's own layers and its checkpoints, for the ``vllm.fp8_refit`` self-check.

``up`` (``ColumnParallelLinear`` 64 -> 32) and ``down`` (``RowParallelLinear`` 32 -> 64) with
``Fp8Config`` for an FP8-serialised checkpoint with static activation scales: per layer an E4M3
``weight``, a float32 ``weight_scale`` and ``input_scale``. One shard per layer, so vLLM's processing
needs none of its compiled quantisation ops (it transposes and re-registers, nothing to requantise)
and runs on CPU from the PyPI wheel; the forward does not (its activation quantisation is a compiled
op), so what a layer serves is read from its kernel tensors: :func:`served` undoes the transpose
without vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

LAYERS = {"up": (32, 64), "down": (64, 32)}  #: name -> (out, in)
INPUT_SCALE = 0.25


def checkpoint(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, (out, inp) in LAYERS.items():
        tensors[f"{name}.weight"] = (torch.randn(out, inp, generator=generator) * 32).to(torch.float8_e4m3fn)
        tensors[f"{name}.weight_scale"] = torch.tensor(0.001 * (1 + torch.rand(1, generator=generator).item()))
        tensors[f"{name}.input_scale"] = torch.tensor(INPUT_SCALE)
    return tensors


def served(layer: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The checkpoint a processed layer serves: its kernel weight ([in, out], E4M3) transposed back,
    and its scales (scalars after processing)."""
    return {
        "weight": layer.weight.detach().t().contiguous(),
        "weight_scale": layer.weight_scale.detach().reshape(()),
        "input_scale": layer.input_scale.detach().reshape(()),
    }


def mismatches(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[str]:
    """The checkpoint tensors ``model`` does not serve bit for bit."""
    wrong = []
    for name in LAYERS:
        for key, tensor in served(getattr(model, name)).items():
            want = weights[f"{name}.{key}"].reshape(tensor.shape)
            same = tensor.shape == want.shape and torch.equal(
                tensor.cpu().reshape(-1).view(torch.uint8), want.to(tensor.dtype).reshape(-1).view(torch.uint8))
            if not same:
                wrong.append(f"{name}.{key}")
    return wrong


class Fp8TwoLinears(torch.nn.Module):
    def __init__(self) -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.fp8 import Fp8Config

        super().__init__()
        config = Fp8Config(is_checkpoint_fp8_serialized=True, activation_scheme="static")
        self.up = ColumnParallelLinear(64, 32, bias=False, quant_config=config, prefix="up",
                                       params_dtype=torch.float32)
        self.down = RowParallelLinear(32, 64, bias=False, quant_config=config, prefix="down",
                                      params_dtype=torch.float32)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)  # type: ignore[no-any-return]
