"""Which vLLM MXFP4 fused-MoE layers a refit can take: the method classes and, per layer, why not.

vLLM (0.24-0.33, ``model_executor/layers/quantization/mxfp4.py``) has two MXFP4 MoE methods:
``GptOssMxfp4MoEMethod`` (gpt-oss checkpoints: ``quant_method: mxfp4`` with ``model_type: gpt_oss``,
and on 0.24 every ``mxfp4`` checkpoint) and ``Mxfp4MoEMethod`` (the canonical ``mxfp4`` method, 0.29+).
Both pick a backend at construction (``method.mxfp4_backend``, from
``fused_moe/oracle/mxfp4.py``) and convert the checkpoint tensors to that backend's layout in
``process_weights_after_loading``.

A refit re-runs that processing on fresh checkpoint tensors and copies what lands on the layer (and
what :func:`served_tensors` names besides) into the tensors in use. That is exact only where every
tensor the kernel reads is one of those. What vLLM picks on Hopper (SM90): for gpt-oss, ``TRITON``
when ``triton_kernels`` imports (the vllm wheel ships it as ``vllm.third_party.triton_kernels``, so by
default), else ``FLASHINFER_CUTLASS_MXFP4_BF16`` (FlashInfer installed), else ``MARLIN``; for the
canonical ``mxfp4`` method ``MARLIN`` (0.33: ``HUMMING`` first when Humming is prioritised).

- ``MARLIN`` (CUDA GPUs of capability 7.5+; what ``--moe-backend marlin`` asks for): the
  weights are repacked and the scales permuted into new layer parameters; the method's quant config
  and kernel hold those parameter objects, which a refit keeps. Proven on CPU against vLLM's own first
  load (tests/vllm/test_mxfp4_moe_refit.py).
- ``TRITON`` (triton_kernels' fused MoE, SM90 to SM12x; gpt-oss's default on Hopper; SwiGLU-OAI experts
  only, so never a canonical ``mxfp4`` layer of SiLU experts): biases become new
  float32 layer parameters; the weights and scales go through ``_swizzle_mxfp4`` (transposed, then
  ``convert_layout`` to triton_kernels' Hopper/Blackwell layouts; on Hopper 0.29+ first pads the
  scales to a multiple of 4 blocks) into new triton_kernels ``Tensor`` wrappers. The weight wrappers replace
  the ``w13_weight``/``w2_weight`` parameters as plain layer attributes; the scale wrappers live in the
  method's ``w13_precision_config``/``w2_precision_config``, which its quant config and kernel hold. The
  checkpoint weight (and, from 0.29, scale) parameters are deleted. A refit keeps the first load's
  wrappers and precision configs and copies the re-processed storage into theirs
  (:func:`served_tensors`): the layout is a function of the shapes alone, so nothing is reallocated.
  Proven on CPU with vLLM's own ``_swizzle_mxfp4`` and triton_kernels' own Hopper layouts
  (tests/vllm/test_mxfp4_moe_refit_triton.py).
- Every other backend is refused: ``FLASHINFER_CUTLASS_MXFP4_BF16`` (Hopper's MXFP4 x BF16 FlashInfer
  kernel, picked for gpt-oss only without triton_kernels or by ``--moe-backend flashinfer_cutlass``) calls
  FlashInfer's SM90 interleave, which was not run here; the FlashInfer TRT-LLM, AITER, CUTLASS, DeepGEMM,
  CPU, XPU, Humming and emulation backends were not run either (their processing needs their own GPU
  libraries or, for CPU, vLLM's CPU build), so nothing shows what they keep besides the layer's tensors.

A padded layer is taken too. vLLM rounds ``hidden_size`` and the per-rank ``intermediate_size`` up to
the backend's tile (``mxfp4_round_up_hidden_size_and_intermediate_size``, 0.24-0.33; Marlin: hidden to
256, intermediate to 128, so gpt-oss's 2880/2880 become 3072/2944) and keeps the checkpoint sizes as
``moe.hidden_dim_unpadded``/``moe.intermediate_size_per_partition_unpadded``. ``create_weights``
registers zeroed parameters of the padded sizes; the loaders write the checkpoint into part of them
(gpt-oss: the top-left corner, ``param.data[:, :d1, :d2]``; per-expert ``mxfp4``: each shard narrowed
to its checkpoint rows and columns) and processing runs over the whole, zero padding included. A refit
reproduces that: :func:`checkpoint_shapes` tells it the checkpoint's shape of each padded parameter,
so it stages zeros of the padded shape and demands exactly the checkpoint's elements.

With tensor parallelism (no expert parallelism) each rank holds a slice of the intermediate size. The
per-expert ``mxfp4`` loader gives each rank ``intermediate // tp`` (``RoutedExperts._load_w13``/``_w2``),
the configured per-rank size. gpt-oss's model loader (``GptOssModel._load_weights_mxfp4``, 0.24-0.33)
slices in whole 32-wide MXFP4 blocks instead: ``cdiv(intermediate // 32, tp) * 32`` rows a rank, the
last rank the rest. Where that is not the configured size (gpt-oss at TP 4: 736, 736, 736 and 672
rows, configured 720, padded to 768) the refit demands gpt-oss's slice (:func:`_gpt_oss_rank_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

#: the ``Mxfp4MoeBackend`` member names a refit is proven on
REFITTABLE_BACKENDS = frozenset({"MARLIN", "TRITON"})
#: the backends whose weights and scales live in triton_kernels wrappers (vLLM's ``TRITON_BACKENDS``
#: that a refit takes)
_TRITON_KERNELS_BACKENDS = frozenset({"TRITON"})

#: What a refit takes of MXFP4, for error messages.
SUPPORTED = "MXFP4 fused-MoE layers on vLLM's MARLIN or TRITON backend, padded or not (vllm.mxfp4_moe_refit)"
MXFP4_BLOCK = 32
#: Which dimension of each checkpoint parameter is the experts' (``e``), hidden (``h``) or
#: intermediate (``i``) one, as ``create_weights`` lays them out (0.24-0.33, both methods).
_LAYOUTS = {
    "w13_weight": "eih",  # (experts, 2 * intermediate, hidden // 2)
    "w13_weight_scale": "eih",  # (experts, 2 * intermediate, hidden // 32)
    "w2_weight": "ehi",  # (experts, hidden, intermediate // 2)
    "w2_weight_scale": "ehi",  # (experts, hidden, intermediate // 32)
    "w13_bias": "ei",  # (experts, 2 * intermediate)
    "w2_bias": "eh",  # (experts, hidden)
}


def backend_name(method: Any) -> str:
    backend = getattr(method, "mxfp4_backend", None)
    return str(getattr(backend, "name", backend))


def unrefittable_reason(method: Any) -> str | None:
    """Why a layer with MXFP4 method ``method`` cannot be refitted, or ``None`` when it can."""
    backend = backend_name(method)
    if backend not in REFITTABLE_BACKENDS:
        return f"MXFP4 backend {backend}; a refit supports {', '.join(sorted(REFITTABLE_BACKENDS))}"
    return None


def describe(method: Any) -> str:
    """The layer's backend, or why it cannot be refitted, for messages."""
    return unrefittable_reason(method) or f"MXFP4 backend {backend_name(method)}"


def served_tensors(method: Any, layer: Any) -> dict[str, torch.Tensor]:
    """The tensors a Triton layer's kernel reads that are not the layer's own: the storage behind the
    triton_kernels wrappers of its weights (layer attributes) and of its swizzled scales (the method's
    precision configs). Empty for every other backend (their kernel tensors are the layer's)."""
    if backend_name(method) not in _TRITON_KERNELS_BACKENDS:
        return {}
    tensors = {}
    for proj in ("w13", "w2"):
        tensors[f"{proj}_weight (triton_kernels storage)"] = _storage(vars(layer)[f"{proj}_weight"])
        config = getattr(method, f"{proj}_precision_config")
        # triton_kernels 3.8 names the weight scale b_mx_scale (vLLM's mxfp4_utils.weight_mx_scale)
        scale = getattr(config, "weight_scale", None)
        if scale is None:
            scale = config.b_mx_scale
        tensors[f"{proj}_precision_config.weight_scale (triton_kernels storage)"] = _storage(scale)
    return tensors


def _storage(wrapped: Any) -> torch.Tensor:
    """The torch tensor a triton_kernels ``Tensor`` keeps its data in (its layout's bytes)."""
    import torch

    data = wrapped.storage.data
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"a triton_kernels tensor whose storage is {type(data).__name__}, not a torch tensor")
    return data


def checkpoint_shapes(method: Any, layer: Any) -> dict[str, tuple[int, ...]]:
    """The checkpoint's shape of each parameter of ``layer`` that vLLM padded (empty: none is)."""
    sizes = _Sizes.of(method, layer)
    if not sizes.padded:
        return {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, layout in _LAYOUTS.items():
        param = layer._parameters.get(name)
        if param is None:
            continue
        shape = tuple(sizes.unpad(kind, size) for kind, size in zip(layout, param.shape, strict=True))
        if shape != tuple(param.shape):
            shapes[name] = shape
    return shapes


@dataclass(frozen=True)
class _Sizes:
    """A layer's padded sizes and the checkpoint's (what its loader writes), from its ``FusedMoEConfig``."""

    hidden: int
    hidden_checkpoint: int
    intermediate: int
    intermediate_checkpoint: int

    @classmethod
    def of(cls, method: Any, layer: Any) -> _Sizes:
        moe = method.moe
        hidden, intermediate = moe.hidden_dim, moe.intermediate_size_per_partition
        per_rank = moe.intermediate_size_per_partition_unpadded or intermediate
        parallel = getattr(moe, "moe_parallel_config", None)
        tp_size, tp_rank = getattr(parallel, "tp_size", 1), getattr(parallel, "tp_rank", 0)
        if tp_size > 1 and _loaded_by_gpt_oss(layer):
            per_rank = _gpt_oss_rank_rows(per_rank * tp_size, tp_size, tp_rank)
        return cls(
            hidden=hidden,
            hidden_checkpoint=moe.hidden_dim_unpadded or hidden,
            intermediate=intermediate,
            intermediate_checkpoint=per_rank,
        )

    @property
    def padded(self) -> bool:
        return (self.hidden, self.intermediate) != (self.hidden_checkpoint, self.intermediate_checkpoint)

    def unpad(self, kind: str, size: int) -> int:
        """The checkpoint's size of a dimension of ``kind`` (``e``/``h``/``i``) that is ``size`` here:
        a multiple or fraction of the padded size (2 * intermediate, hidden // 32) scales with it."""
        if kind == "h":
            return size * self.hidden_checkpoint // self.hidden
        if kind == "i":
            return size * self.intermediate_checkpoint // self.intermediate
        return size


def _loaded_by_gpt_oss(layer: Any) -> bool:
    """Whether vLLM's gpt-oss model loads ``layer``: its fused-MoE loader takes whole tensors for the
    ``gpt_oss_mxfp4`` quant config only (every other config loads per expert)."""
    config = getattr(layer, "quant_config", None)
    return config is not None and config.get_name() == "gpt_oss_mxfp4"


def _gpt_oss_rank_rows(intermediate: int, tp_size: int, tp_rank: int) -> int:
    """The intermediate rows ``GptOssModel._load_weights_mxfp4`` hands tensor-parallel rank ``tp_rank``:
    whole 32-wide blocks, ``cdiv(blocks, tp_size)`` a rank, the last ranks what is left (maybe none)."""
    blocks = intermediate // MXFP4_BLOCK
    per_rank = -(-blocks // tp_size) * MXFP4_BLOCK
    start = tp_rank * per_rank
    return max(0, min(start + per_rank, intermediate) - start)
