"""The refit formats, in one table: which layers each takes, which patch records them, which hooks it adds.

Every part of a refit reads this table and nothing else about formats: the recording pair every refit
patch installs (``_record``) finds a layer's row to decide whether and how to record it, the
check before a refit (``_impl``) finds it to take or refuse the layer, and ``refit_mode`` asks
the engine about the patches it names. Adding a format is its declaration and one row here (plus the
row's hooks, where its layers need them); docs/vllm-refit.md ("Adding a format") shows both.

- No quant method, vLLM's unquantized linear/embedding/fused-MoE methods (subclasses too, such as the
  MoE router's gate method: they keep the checkpoint layout) and KV-cache methods (their scales are
  refitted by ``_impl``): loaded in place.
- A layer of a format in :data:`FORMATS` is refitted once that format's patch has recorded it (and is
  still installed); one processed before its patch recorded it, or whose patch was reverted since, is
  refused by name, naming the patch.
- Anything else (compressed-tensors schemes other than NVFP4, which hang off ``layer.scheme``;
  AWQ/GPTQ; online FP8 other than per tensor, e.g. per block or per channel): refused. Their
  processing turns checkpoint tensors into kernel tensors patchkit has not
  recorded, so vLLM's loaders would write raw checkpoint values into them and the model would serve
  garbage.

A format is recognised by its quant-method classes (exactly, or with subclasses), or, for
compressed-tensors linear layers (one generic method for every scheme), by the scheme vLLM put on
``layer.scheme``. Classes are looked up in the modules already imported, never by importing one: a
layer of a class exists only once its module is imported, and an import from inside a refit's check
could land inside vLLM's own import of that module (a circular import).

A fused-MoE layer whose method vLLM wrapped in ``FusedMoEModularMethod`` is judged by the method it
wraps (``old_quant_method``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._constants import NVFP4_REFIT_PATCH_ID
from . import _fp8_online_targets, _mxfp4_targets, _mxfp8_targets

if TYPE_CHECKING:
    import torch

_QUANT = "vllm.model_executor.layers.quantization"
FP8 = f"{_QUANT}.fp8"
ONLINE_FP8 = f"{_QUANT}.online.fp8"
MODELOPT = f"{_QUANT}.modelopt"
MXFP4 = f"{_QUANT}.mxfp4"
CT_SCHEMES = f"{_QUANT}.compressed_tensors.schemes"
CT_MOE_NVFP4 = f"{_QUANT}.compressed_tensors.compressed_tensors_moe.compressed_tensors_moe_w4a4_nvfp4"


@dataclass(frozen=True)
class RefitFormat:
    """One format a refit takes: how its layers are recognised, which patch records them, and the
    hooks its layers need (all optional)."""

    #: the patch that records this format's layers
    patch_id: str
    #: what a refit takes of it, for error messages
    describe: str
    #: its quant-method classes, as ``"module:Class"`` (a name a release lacks is skipped)
    methods: tuple[str, ...] = ()
    #: whether subclasses of :attr:`methods` are this format too
    subclasses: bool = False
    #: compressed-tensors schemes on ``layer.scheme``, as ``"module:Class"`` (exactly)
    schemes: tuple[str, ...] = ()
    #: why a layer of this format cannot be refitted after all (its backend), or ``None``
    unrefittable: Callable[[Any], str | None] | None = None
    #: what to add to the method's name in a message about a layer of this format
    detail: Callable[[Any], str] | None = None
    #: ``(method, layer)`` -> the checkpoint's shape of each parameter vLLM padded beyond it
    #: (``ParamSpec.checkpoint_shape``), for a format whose layers vLLM may pad
    checkpoint_shapes: Callable[[Any, Any], Mapping[str, tuple[int, ...]]] | None = None
    #: ``(layer)``, run before a refit's own processing of a recorded layer: undo what makes upstream's
    #: processing run only once
    before_reprocessing: Callable[[Any], None] | None = None
    #: ``(method, layer)`` -> tensors the kernel reads that are not the layer's own tensors, by a name
    #: (MXFP4 on Triton: the storage behind triton_kernels' wrapped weights and the swizzled scales in the
    #: method's precision configs); recorded with the layer's kernel tensors and refitted in place like them
    served_tensors: Callable[[Any, Any], Mapping[str, torch.Tensor]] | None = None
    #: ``(method)`` -> the kernel backend the layer runs, named in its record and in messages
    backend: Callable[[Any], str] | None = None

    def method_classes(self) -> tuple[type, ...]:
        return _imported(self.methods)

    def matches(self, method: Any, layer: Any) -> bool:
        """Whether a layer with quant method ``method`` (already unwrapped) is of this format."""
        classes = self.method_classes()
        if classes and (isinstance(method, classes) if self.subclasses else type(method) in classes):
            return True
        return bool(self.schemes) and layer is not None and type(getattr(layer, "scheme", None)) in _imported(
            self.schemes)


#: Every format a refit takes, in the order they are tried (exact classes before subclass matches).
FORMATS: tuple[RefitFormat, ...] = (
    RefitFormat(
        "vllm.fp8_refit", "FP8-serialised Fp8LinearMethod/Fp8MoEMethod layers (vllm.fp8_refit)",
        methods=(f"{FP8}:Fp8LinearMethod", f"{FP8}:Fp8MoEMethod"),
    ),
    RefitFormat(
        # a bf16 checkpoint quantised at load: a refit takes bf16 weights and re-runs upstream's quantisation
        "vllm.fp8_online_refit",
        "online-FP8 Fp8PerTensorOnlineLinearMethod/Fp8PerTensorOnlineMoEMethod layers, bf16 weights "
        "(vllm.fp8_online_refit)",
        methods=(f"{ONLINE_FP8}:Fp8PerTensorOnlineLinearMethod", f"{ONLINE_FP8}:Fp8PerTensorOnlineMoEMethod"),
        before_reprocessing=_fp8_online_targets.allow_reprocessing,
    ),
    RefitFormat(
        # vLLM 0.24's Fp8Config builds this subclass of Fp8MoEMethod for a bf16 checkpoint's MoE layers
        "vllm.fp8_online_moe_refit",
        "online-FP8 Fp8OnlineMoEMethod layers, bf16 weights (vllm.fp8_online_moe_refit)",
        methods=(f"{FP8}:Fp8OnlineMoEMethod",),
        before_reprocessing=_fp8_online_targets.allow_reprocessing,
    ),
    RefitFormat(
        # ModelOptMxFp8LinearMethod exists in vLLM 0.16-0.29, ModelOptMxFp8FusedMoE in 0.18-0.33; from
        # 0.30 an MXFP8 linear layer uses the generic ModelOptLinearMethod (vllm.nvfp4_refit).
        "vllm.mxfp8_refit", "ModelOpt MXFP8 layers (vllm.mxfp8_refit)",
        methods=(f"{MODELOPT}:ModelOptMxFp8LinearMethod", f"{MODELOPT}:ModelOptMxFp8FusedMoE"),
        before_reprocessing=_mxfp8_targets.allow_reprocessing,
    ),
    RefitFormat(
        "vllm.nvfp4_refit", "ModelOpt NVFP4 layers (vllm.nvfp4_refit)",
        methods=tuple(f"{MODELOPT}:{name}" for name in (
            "ModelOptNvFp4LinearMethod", "ModelOptNvFp4W4A16LinearMethod", "ModelOptLinearMethod",
            "ModelOptNvFp4FusedMoE")),
        subclasses=True,
    ),
    RefitFormat(
        "vllm.compressed_tensors_nvfp4_refit",
        "compressed-tensors NVFP4 linear layers (vllm.compressed_tensors_nvfp4_refit)",
        schemes=(f"{CT_SCHEMES}:CompressedTensorsW4A4Fp4",),
    ),
    RefitFormat(
        "vllm.compressed_tensors_nvfp4_moe_refit",
        "compressed-tensors NVFP4 fused-MoE layers (vllm.compressed_tensors_nvfp4_moe_refit)",
        methods=(f"{CT_MOE_NVFP4}:CompressedTensorsW4A4Nvfp4MoEMethod",),
    ),
    RefitFormat(
        "vllm.mxfp4_moe_refit", _mxfp4_targets.SUPPORTED,
        methods=(f"{MXFP4}:GptOssMxfp4MoEMethod", f"{MXFP4}:Mxfp4MoEMethod"),
        unrefittable=_mxfp4_targets.unrefittable_reason,
        detail=_mxfp4_targets.describe,
        checkpoint_shapes=_mxfp4_targets.checkpoint_shapes,
        served_tensors=_mxfp4_targets.served_tensors,
        backend=_mxfp4_targets.backend_name,
    ),
)

def supported() -> str:
    """What a refit takes, for error messages."""
    return "unquantized layers, KV-cache scales, " + ", ".join(f.describe for f in FORMATS)


def recording_patches() -> tuple[str, ...]:
    """The patches that record layers for a refit, each once, the first refit patch first (its state
    is what ``refit_mode`` reports when none is installed)."""
    return tuple(dict.fromkeys((NVFP4_REFIT_PATCH_ID, *(f.patch_id for f in FORMATS))))


def matching_format(method: Any, layer: Any = None) -> RefitFormat | None:
    """The row of a layer with quant method ``method``, whether or not a refit can take this layer."""
    method = wrapped_method(method)
    for fmt in FORMATS:
        if fmt.matches(method, layer):
            return fmt
    return None


def format_of(method: Any, layer: Any = None) -> RefitFormat | None:
    """The format of a layer with quant method ``method``, if a refit takes it."""
    fmt = matching_format(method, layer)
    if fmt is None or (fmt.unrefittable is not None and fmt.unrefittable(wrapped_method(method)) is not None):
        return None
    return fmt


def recording_patch(method: Any, layer: Any = None) -> str | None:
    """The patch that must record ``layer`` (quant method ``method``) before it can be refitted
    (``None``: a layer the refit loads in place, or does not cover)."""
    fmt = format_of(method, layer)
    return fmt.patch_id if fmt is not None else None


def served_tensors(method: Any, layer: Any) -> dict[str, torch.Tensor]:
    """The tensors the kernel of ``layer`` reads besides the layer's own (its row's ``served_tensors``)."""
    fmt = matching_format(method, layer)
    if fmt is None or fmt.served_tensors is None:
        return {}
    return dict(fmt.served_tensors(wrapped_method(method), layer))


def backend(method: Any, layer: Any = None) -> str | None:
    """The kernel backend a layer of a format with several runs (its row's ``backend``), else ``None``."""
    fmt = matching_format(method, layer)
    return fmt.backend(wrapped_method(method)) if fmt is not None and fmt.backend is not None else None


def loads_in_place(method: Any) -> bool:
    """Whether a layer with quant method ``method`` keeps checkpoint-layout tensors vLLM's loaders can
    write again (or, for KV-cache methods, scales ``_impl`` refits itself)."""
    method = wrapped_method(method)
    return method is None or isinstance(method, _in_place_classes())


def wrapped_method(method: Any) -> Any:
    """The method vLLM's ``FusedMoEModularMethod`` wraps, else ``method`` itself."""
    return getattr(method, "old_quant_method", None) or method


def describe_method(layer: Any, method: Any) -> str:
    """The layer's method class, with the compressed-tensors scheme it delegates to (``layer.scheme``)
    and, for a format whose layer cannot be refitted after all, why."""
    method = wrapped_method(method)
    text = type(method).__name__
    scheme = getattr(layer, "scheme", None)
    if scheme is not None:
        text += f" (scheme {type(scheme).__name__})"
    for fmt in FORMATS:
        if fmt.detail is not None and fmt.matches(method, layer):
            text += f" ({fmt.detail(method)})"
    return text


def _imported(references: tuple[str, ...]) -> tuple[type, ...]:
    classes = []
    for reference in references:
        module, _, name = reference.partition(":")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            classes.append(cls)
    return tuple(classes)


def _in_place_classes() -> tuple[type, ...]:
    return _imported((
        "vllm.model_executor.layers.fused_moe:UnquantizedFusedMoEMethod",
        "vllm.model_executor.layers.linear:UnquantizedLinearMethod",
        "vllm.model_executor.layers.quantization.kv_cache:BaseKVCacheMethod",
        "vllm.model_executor.layers.vocab_parallel_embedding:UnquantizedEmbeddingMethod",
    ))
