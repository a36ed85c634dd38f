"""A fused-MoE model of one vLLM MoE layer, built by vLLM's own factory, and its per-expert checkpoint.

Shared by the ``vllm.moe_expert_weight_loaders`` self-check and its tests. ``quantized=True``:
ModelOpt NVFP4 (processed on CPU by vLLM's emulation backend, ``_cpu_stand_in.cpu_nvfp4_kernels``);
``quantized=False``: vLLM's unquantized MoE method. Checkpoint names are a model's
(``experts.<e>.gate_proj.weight``...), mapped onto the fused parameters by vLLM's own
``make_expert_params_mapping`` and written by each parameter's ``weight_loader``, as vLLM models'
``load_weights`` do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

from .._nvfp4_checkpoint import random_nvfp4

EXPERTS, HIDDEN, INTERMEDIATE = 4, 64, 32
PROJECTIONS = (("gate_proj", (INTERMEDIATE, HIDDEN)), ("up_proj", (INTERMEDIATE, HIDDEN)),
               ("down_proj", (HIDDEN, INTERMEDIATE)))
# vLLM registers each MoE layer by prefix in the process-wide forward context: names must differ.
_numbers = itertools.count()


class OneMoeLayer(torch.nn.Module):
    """One vLLM fused-MoE layer (``experts``) of ``experts`` experts with ``quant_config``, built by vLLM's own
    factory and loaded through its expert mapping (:func:`load_by_expert_mapping`). Shared by every format's
    self-check model; ``name`` makes the layer's prefix (numbered: vLLM registers MoE layers by prefix),
    ``extra`` goes to the factory (gpt-oss's ``has_bias``, ``activation``)."""

    def __init__(self, quant_config: Any, *, hidden: int, intermediate: int, experts: int, name: str,
                 params_dtype: torch.dtype = torch.bfloat16, **extra: Any) -> None:
        from vllm.model_executor.layers import fused_moe

        super().__init__()
        self.num_experts = experts
        factory = getattr(fused_moe, "FusedMoEFactory", None) or fused_moe.FusedMoE  # 0.25+ / 0.24
        self.experts = factory(
            num_experts=experts, top_k=2, hidden_size=hidden, intermediate_size=intermediate,
            params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"patchkit_{name}{next(_numbers)}.experts", tp_size=1, dp_size=1, pcp_size=1, **extra,
        )

    @property
    def routed(self) -> torch.nn.Module:
        """The module that owns the expert parameters and their ``weight_loader``."""
        return getattr(self.experts, "routed_experts", self.experts)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Each checkpoint tensor through the ``weight_loader`` of the parameter it maps to."""
        return load_by_expert_mapping(self, weights, self.num_experts)


class TinyMoE(OneMoeLayer):
    def __init__(self, quantized: bool) -> None:
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__(ModelOptNvFp4Config("NVFP4", True, None, [], 16) if quantized else None, hidden=HIDDEN,
                         intermediate=INTERMEDIATE, experts=EXPERTS, name="moe", params_dtype=torch.float32)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> set[str]:  # type: ignore[override]
        """A checkpoint dict, each tensor through the ``weight_loader`` of the parameter it maps to."""
        return super().load_weights(weights.items())


def load_by_expert_mapping(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                           experts: int) -> set[str]:
    """Per-expert checkpoint names (``experts.<e>.{gate,up,down}_proj.*``) onto the fused parameters, as a
    vLLM MoE model's ``load_weights`` maps them: vLLM's own ``make_expert_params_mapping``, each tensor
    through its parameter's ``weight_loader``. A name no entry maps, or that maps to no parameter, is a
    ``ValueError`` (a model's loader would skip it without a word)."""
    from vllm.model_executor.layers.fused_moe.layer import fused_moe_make_expert_params_mapping

    mapping = fused_moe_make_expert_params_mapping(model, "gate_proj", "down_proj", "up_proj", experts)
    params = dict(model.named_parameters())  # read now: a prepared refit has staged new ones
    loaded = set()
    for name, tensor in weights:
        for param_name, weight_name, expert_id, shard_id in mapping:
            if weight_name in name:
                mapped = name.replace(weight_name, param_name)
                if mapped not in params:
                    raise ValueError(f"no fused-MoE parameter {mapped!r} for {name!r}")
                param = params[mapped]
                param.weight_loader(param, tensor, mapped, shard_id=shard_id, expert_id=expert_id)
                loaded.add(mapped)
                break
        else:
            raise ValueError(f"no fused-MoE parameter for {name!r}")
    return loaded


def checkpoint(quantized: bool, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for expert, (proj, shape) in itertools.product(range(EXPERTS), PROJECTIONS):
        prefix = f"experts.{expert}.{proj}"
        if not quantized:
            weights[f"{prefix}.weight"] = torch.randn(*shape, generator=generator)
            continue
        weights[f"{prefix}.weight"], weights[f"{prefix}.weight_scale"] = random_nvfp4(generator, *shape)
        weights[f"{prefix}.weight_scale_2"] = torch.tensor(0.01 * (expert + 1))
        weights[f"{prefix}.input_scale"] = torch.tensor(1.0)
    return weights


def loaders_of(model: TinyMoE) -> dict[str, Any]:
    """Each expert parameter -> its ``weight_loader`` (None when it has none)."""
    return {name: getattr(param, "weight_loader", None) for name, param in model.routed.named_parameters()}


def is_the_layers_loader(loader: Any, layer: torch.nn.Module) -> bool:
    return getattr(loader, "__self__", None) is layer and getattr(loader, "__func__", None) is getattr(
        type(layer).weight_loader, "__func__", type(layer).weight_loader)


def processed_tiny_moe(context_device: str, quantized: bool = True) -> Any:
    """vLLM's fused-MoE layer built, loaded and processed by vLLM's own code, on ``context_device``."""
    # Looked up at each call: the tests substitute ``_nvfp4_checkpoint.process_weights_after_loading``.
    from .._nvfp4_checkpoint import process_weights_after_loading
    from ._cpu_stand_in import vllm_context

    with vllm_context(context_device), torch.device(context_device):
        model = TinyMoE(quantized)
        model.load_weights({k: v.to(context_device) for k, v in checkpoint(quantized, seed=0).items()})
        process_weights_after_loading(model)
    return model
