"""The serving side of the end-to-end tests: vLLM's own NVFP4 layers at the trainer's names.

``ServingModel`` is built from the names and shapes ``export_qat_weights`` yields for a Megatron
model (Megatron names: no Bridge on Python 3.11). Every quantized linear becomes a vLLM
``ColumnParallelLinear`` / ``RowParallelLinear`` (TP=1) with ``ModelOptNvFp4Config``, so its
parameters are made by vLLM's ``create_weights``; every quantized MoE layer becomes one vLLM fused
MoE layer (``moe_helpers.MoEModel``); every other tensor a plain parameter. Loading goes through
vLLM's ``AutoWeightsLoader`` and the layers' own weight loaders, as a vLLM model's
``load_weights`` does. The one piece of name mapping is ``ExpertsAdapter``: Megatron keeps an
expert's gate and up projections as one ``linear_fc1`` (``[gate; up]`` rows, one global scale), vLLM's
MoE loader takes ``gate_proj`` / ``up_proj`` / ``down_proj`` per expert (what a Hugging Face
checkpoint has), so the adapter splits rows, as a vLLM model maps its checkpoint's names.

What vLLM's kernels multiply is read with vLLM's own dequantizer
(``nvfp4_emulation_utils.dequantize_to_dtype``, the function the CPU emulation linear kernel calls;
its MoE Triton kernel multiplies in the same order: E2M1 value x (block scale x global scale)).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import torch
from moe_helpers import MoEModel

EXPERT = re.compile(r"^(?P<moe>.+\.mlp\.experts)\.local_experts\.(?P<e>\d+)\.(?P<fc>linear_fc[12])\.(?P<p>\w+)$")
ROW_PARALLEL = ("linear_proj", "linear_fc2")


class Node(torch.nn.Module):
    """A plain container at one component of a dotted name."""


def _container(root: torch.nn.Module, dotted: str) -> torch.nn.Module:
    node = root
    for part in filter(None, dotted.split(".")):
        if part not in node._modules:
            node.add_module(part, Node())
        node = node._modules[part]
    return node


def quantized_linears(shapes: dict[str, tuple[torch.Size, torch.dtype]]) -> list[str]:
    return [n[: -len(".weight_scale")] for n in shapes if n.endswith(".weight_scale")]


class ExpertsAdapter(torch.nn.Module):
    """A Megatron ``mlp.experts`` (SequentialMLP) served by one vLLM fused-MoE layer."""

    def __init__(self, experts: int, hidden: int, intermediate: int, params_dtype: torch.dtype):
        super().__init__()
        # ModelOptNvFp4Config("NVFP4"): vLLM 0.29 builds W4A16_NVFP4 MoE only with Marlin (CUDA).
        self.moe = MoEModel(experts=experts, hidden=hidden, intermediate=intermediate, params_dtype=params_dtype)
        self.intermediate = intermediate

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        def renamed() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                match = re.fullmatch(r"local_experts\.(\d+)\.(linear_fc[12])\.(\w+)", name)
                if match is None:
                    raise KeyError(f"no parameter for {name!r}")
                expert, fc, param = match.groups()
                prefix = f"experts.{expert}"
                if fc == "linear_fc2":
                    yield f"{prefix}.down_proj.{param}", tensor
                elif param in ("weight", "weight_scale"):  # rows: gate, then up
                    yield f"{prefix}.gate_proj.{param}", tensor[: self.intermediate]
                    yield f"{prefix}.up_proj.{param}", tensor[self.intermediate:]
                else:  # one global scale (and input scale) for the fused fc1
                    yield f"{prefix}.gate_proj.{param}", tensor
                    yield f"{prefix}.up_proj.{param}", tensor

        self.moe.load_weights(renamed())
        return set()

    @property
    def routed(self) -> torch.nn.Module:
        return self.moe.routed


class ServingModel(torch.nn.Module):
    """vLLM layers for every tensor of an export, at the same names (see module docstring).

    ``leave_out`` names a quantized linear (or MoE prefix, or plain parameter) the model does not
    have: the "vLLM model missing a name" case.
    """

    def __init__(self, shapes: dict[str, tuple[torch.Size, torch.dtype]], quant: str | object,
                 params_dtype: torch.dtype, leave_out: tuple[str, ...] = ()):
        from vllm.model_executor.layers.linear import ColumnParallelLinear, RowParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        # ``quant``: a quant_algo, or a ``ModelOptNvFp4Config`` (e.g. vLLM's ``from_config`` of the
        # exported ``hf_quant_config``, as an engine started for that checkpoint has).
        quant_config = ModelOptNvFp4Config(quant, True, None, [], 16) if isinstance(quant, str) else quant
        if any(EXPERT.match(n) for n in shapes):
            assert quant_config.quant_method == "NVFP4", "vLLM 0.29 builds W4A16_NVFP4 MoE with Marlin only (CUDA)"
        self.linears: list[str] = []
        self.moe_layers: list[str] = []
        covered: set[str] = set()
        experts: dict[str, dict[str, object]] = {}
        for name, (shape, _) in shapes.items():
            match = EXPERT.match(name)
            if match is None:
                continue
            covered.add(name)
            info = experts.setdefault(match["moe"], {"ids": set()})
            info["ids"].add(int(match["e"]))  # type: ignore[union-attr]
            if match["fc"] == "linear_fc2" and match["p"] == "weight":
                info["hidden"], info["intermediate"] = shape[0], shape[1] * 2
        for prefix, info in experts.items():
            if prefix in leave_out:
                continue
            parent, _, leaf = prefix.rpartition(".")
            _container(self, parent).add_module(leaf, ExpertsAdapter(
                len(info["ids"]), info["hidden"], info["intermediate"], params_dtype))  # type: ignore
            self.moe_layers.append(prefix)
        for linear in quantized_linears(shapes):
            covered.update(f"{linear}.{p}" for p in ("weight", "weight_scale", "weight_scale_2", "input_scale"))
            if EXPERT.match(f"{linear}.weight") or linear in leave_out:
                continue
            out_features, packed_in = shapes[f"{linear}.weight"][0]
            parent, _, leaf = linear.rpartition(".")
            cls = RowParallelLinear if leaf in ROW_PARALLEL else ColumnParallelLinear
            layer = cls(packed_in * 2, out_features, bias=False, quant_config=quant_config, prefix=linear,
                        params_dtype=params_dtype)
            _container(self, parent).add_module(leaf, layer)
            self.linears.append(linear)
        for name, (shape, dtype) in shapes.items():
            if name in covered or name in leave_out:
                continue
            parent, _, leaf = name.rpartition(".")
            _container(self, parent).register_parameter(
                leaf, torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


def with_input_scales(weights: Iterable[tuple[str, torch.Tensor]], value: float) -> Iterator[tuple[str, torch.Tensor]]:
    """The export stream plus an ``input_scale`` per quantized linear (the W4A4 method needs one)."""
    for name, tensor in weights:
        yield name, tensor
        if name.endswith(".weight_scale_2"):
            yield name[: -len("weight_scale_2")] + "input_scale", torch.tensor(value, dtype=torch.float32)


def served_linear_weight(layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    """The weight vLLM's emulation linear kernel multiplies (its own call, same arguments)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    return dequantize_to_dtype(layer.weight.data.view(torch.uint8), layer.weight_scale.data,
                               layer.weight_global_scale, dtype, 16, swizzle=False)


def served_expert_weights(adapter: ExpertsAdapter, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``w13`` [E, 2I, H] and ``w2`` [E, H, I] as vLLM's NVFP4 MoE kernel dequantizes them."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    layer = adapter.routed
    w13 = dequantize_to_dtype(layer.w13_weight.data, layer.w13_weight_scale.data,
                              layer.w13_weight_scale_2.reshape(-1), dtype, 16, swizzle=False)
    w2 = dequantize_to_dtype(layer.w2_weight.data, layer.w2_weight_scale.data,
                             layer.w2_weight_scale_2.reshape(-1), dtype, 16, swizzle=False)
    return w13, w2
