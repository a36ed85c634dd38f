"""A one-layer MXFP4 fused-MoE model of vLLM's own layer, its checkpoints, and the ``vllm.mxfp4_moe_refit``
self-check; shared with tests/vllm/test_mxfp4_moe_refit.py.

The layer is built by vLLM's MoE factory with ``GptOssMxfp4Config`` (``kind="gpt_oss"``: gpt-oss
checkpoints, biases, SwiGLU-OAI activation) or ``Mxfp4Config`` (``kind="mxfp4"``), on vLLM's MARLIN
backend (``kernel_config.moe_backend = "marlin"``: vLLM's ``--moe-backend marlin``). Checkpoint
tensors are loaded as vLLM's models load them: gpt-oss hands whole fused tensors to the layer's
``weight_loader`` (``shard_id=None``, ``expert_id=None``; ``GptOssModel._load_weights_mxfp4`` with one
rank), ``mxfp4`` per-expert ``gate_proj``/``up_proj``/``down_proj`` tensors through vLLM's
``make_expert_params_mapping``.

:func:`marlin_backend` on CPU stands in for what needs CUDA, and only that: Marlin's device check
(``MarlinExpertsBase._supports_current_device``: CUDA, capability 7.5+) answers True, and the CUDA op
``gptq_marlin_repack`` is replaced by a reshape to the shape Marlin returns (a stand-in layout: every
output bit comes from one input bit, so the comparisons below see every byte of the checkpoint; no
Marlin forward can run). The scale permutation and E8M0 conversion are vLLM's own torch code. Without a
``ModelConfig`` (the doctor's vLLM context) the two fields the MXFP4 oracle reads of it are given:
no quantization-config override, bfloat16.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..._checks._cpu_stand_in import model_config_fields
from ..._checks._tiny_moe import OneMoeLayer, load_by_expert_mapping
from . import _round_trip as _round_trip

EXPERTS = 4
#: Marlin tiles: hidden a multiple of 256, intermediate of 128 (vLLM pads anything else up to these)
HIDDEN, INTERMEDIATE = 256, 256
#: gpt-oss-20b/120b's sizes: Marlin pads both (hidden 2880 -> 3072, intermediate 2880 -> 2944)
GPT_OSS_HIDDEN, GPT_OSS_INTERMEDIATE = 2880, 2880
MXFP4_BLOCK = 32
KINDS = ("gpt_oss", "mxfp4")


def _marlin_repack_standin(b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int,
                           **_: object) -> torch.Tensor:  # 0.24 passes perm=, 0.33 is_a_8bit=
    assert num_bits == 4
    return b_q_weight.reshape(size_k // 16, size_n * 16 // 8).clone()


@contextlib.contextmanager
def marlin_backend(device: str) -> Iterator[None]:
    """vLLM's MARLIN MXFP4 MoE backend for layers built in the block (CPU: the stand-ins above)."""
    from vllm.config import get_current_vllm_config

    kernel_config = get_current_vllm_config().kernel_config
    saved_backend = kernel_config.moe_backend
    with contextlib.ExitStack() as stack:
        kernel_config.moe_backend = "marlin"
        stack.callback(setattr, kernel_config, "moe_backend", saved_backend)
        # What the MXFP4 oracle reads of the model config: no quantization-config override, bfloat16.
        stack.enter_context(model_config_fields(quantization_config=None, dtype=torch.bfloat16))
        if device == "cpu":
            import vllm._custom_ops as ops
            from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExpertsBase

            saved_repack = ops.gptq_marlin_repack
            saved_check = MarlinExpertsBase.__dict__["_supports_current_device"]
            ops.gptq_marlin_repack = _marlin_repack_standin
            MarlinExpertsBase._supports_current_device = staticmethod(lambda: True)
            stack.callback(setattr, ops, "gptq_marlin_repack", saved_repack)
            stack.callback(setattr, MarlinExpertsBase, "_supports_current_device", saved_check)
        yield


def _config(kind: str) -> Any:
    from vllm.model_executor.layers.quantization import mxfp4

    return mxfp4.GptOssMxfp4Config() if kind == "gpt_oss" else mxfp4.Mxfp4Config()


class Mxfp4Moe(OneMoeLayer):
    """One vLLM fused-MoE layer (``experts``) with an MXFP4 config; build inside :func:`marlin_backend`."""

    def __init__(self, kind: str, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE,
                 tp: tuple[int, int] | None = None) -> None:
        """``intermediate`` is per rank; ``tp`` (size, rank) makes the layer one rank of that many (see
        :func:`as_tp_rank`)."""
        extra = {"has_bias": True, "activation": "swigluoai"} if kind == "gpt_oss" else {}
        super().__init__(_config(kind), hidden=hidden, intermediate=intermediate, experts=EXPERTS,
                         name="mxfp4_moe", **extra)
        self.kind = kind
        self.hidden, self.intermediate = hidden, intermediate  # the checkpoint's sizes
        if tp is not None:
            as_tp_rank(self.routed, *tp)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        loaded = set()
        if self.kind == "gpt_oss":
            # ``experts.<parameter>``: vLLM's gpt-oss model maps its checkpoint names onto these
            params = dict(self.routed.named_parameters())  # read once, as vLLM's models do
            for name, tensor in weights:
                param = params[name.removeprefix("experts.")]
                param.weight_loader(param, tensor, weight_name=name, shard_id=None, expert_id=None)
                loaded.add(name)
            return loaded
        return load_by_expert_mapping(self, weights, EXPERTS)


def as_tp_rank(routed: torch.nn.Module, tp_size: int, tp_rank: int) -> None:
    """Make a layer built for one rank with the per-rank intermediate size look like rank ``tp_rank`` of
    ``tp_size`` to its MXFP4 method: the ``tp_size``/``tp_rank`` of vLLM's own ``FusedMoEParallelConfig``
    (one process cannot start several ranks). The padded sizes are those vLLM computes for that rank:
    it pads the per-rank size, which is what the layer was built with."""
    import dataclasses

    moe = routed.quant_method.moe
    moe.moe_parallel_config = dataclasses.replace(moe.moe_parallel_config, tp_size=tp_size, tp_rank=tp_rank)


def gpt_oss_rank_slice(weights: dict[str, torch.Tensor], tp_size: int, tp_rank: int) -> dict[str, torch.Tensor]:
    """What ``GptOssModel._load_weights_mxfp4`` (0.24-0.33, no expert parallelism) hands tensor-parallel rank
    ``tp_rank`` of a gpt-oss checkpoint (:func:`checkpoint`): intermediate slices in whole 32-wide blocks,
    the down-projection bias on rank 0 only (zeros elsewhere)."""
    intermediate = weights["experts.w2_weight"].shape[-1] * 2
    per_rank = -(-(intermediate // MXFP4_BLOCK) // tp_size) * MXFP4_BLOCK
    start, end = tp_rank * per_rank, min((tp_rank + 1) * per_rank, intermediate)
    return {
        "experts.w13_weight": weights["experts.w13_weight"][:, 2 * start:2 * end, ...],
        "experts.w13_weight_scale": weights["experts.w13_weight_scale"][:, 2 * start:2 * end, ...],
        "experts.w13_bias": weights["experts.w13_bias"][:, 2 * start:2 * end],
        "experts.w2_weight": weights["experts.w2_weight"][..., start // 2:end // 2],
        "experts.w2_weight_scale": weights["experts.w2_weight_scale"][..., start // MXFP4_BLOCK:end // MXFP4_BLOCK],
        "experts.w2_bias": weights["experts.w2_bias"] if tp_rank == 0 else torch.zeros_like(weights["experts.w2_bias"]),
    }


def _packed(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """Random bytes: two E2M1 values each (every pattern is a number)."""
    return torch.randint(0, 256, shape, generator=generator, dtype=torch.uint8)


def _scales(generator: torch.Generator, *shape: int) -> torch.Tensor:
    """E8M0 exponents around 2^0 (uint8, as gpt-oss checkpoints store them; 255 would be NaN)."""
    return torch.randint(120, 135, shape, generator=generator, dtype=torch.uint8)


def checkpoint(kind: str, seed: int, hidden: int = HIDDEN, intermediate: int = INTERMEDIATE) -> dict[str, torch.Tensor]:
    """A random MXFP4 checkpoint: gpt-oss fused tensors, or per-expert projections (``kind="mxfp4"``)."""
    generator = torch.Generator().manual_seed(seed)
    if kind == "gpt_oss":
        return {
            "experts.w13_weight": _packed(generator, EXPERTS, 2 * intermediate, hidden // 2),
            "experts.w13_weight_scale": _scales(generator, EXPERTS, 2 * intermediate, hidden // MXFP4_BLOCK),
            "experts.w13_bias": torch.randn(EXPERTS, 2 * intermediate, generator=generator).to(torch.bfloat16),
            "experts.w2_weight": _packed(generator, EXPERTS, hidden, intermediate // 2),
            "experts.w2_weight_scale": _scales(generator, EXPERTS, hidden, intermediate // MXFP4_BLOCK),
            "experts.w2_bias": torch.randn(EXPERTS, hidden, generator=generator).to(torch.bfloat16),
        }
    tensors = {}
    for expert, (proj, (out, inp)) in itertools.product(
        range(EXPERTS), (("gate_proj", (intermediate, hidden)), ("up_proj", (intermediate, hidden)),
                         ("down_proj", (hidden, intermediate)))):
        tensors[f"experts.{expert}.{proj}.weight"] = _packed(generator, out, inp // 2)
        tensors[f"experts.{expert}.{proj}.weight_scale"] = _scales(generator, out, inp // MXFP4_BLOCK)
    return tensors


def first_load(kind: str, weights: dict[str, torch.Tensor], device: str = "cpu",
               hidden: int = HIDDEN, intermediate: int = INTERMEDIATE, tp: tuple[int, int] | None = None) -> Mxfp4Moe:
    """vLLM's own first load: a fresh model, its loaders, its processing (inside :func:`marlin_backend`)."""
    from ..._nvfp4_checkpoint import process_weights_after_loading

    with torch.device(device):
        model = Mxfp4Moe(kind, hidden, intermediate, tp)
    model.load_weights((name, tensor.to(device)) for name, tensor in weights.items())
    process_weights_after_loading(model)
    return model


#: An MXFP4 layer is compared by its parameters (what its Marlin processing writes).
kernel_bytes = functools.partial(_round_trip.kernel_bytes, buffers=False)
differing = functools.partial(_round_trip.differing, buffers=False)
