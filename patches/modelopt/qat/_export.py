"""Export a QAT-trained Megatron model as ModelOpt NVFP4 checkpoint tensors, one layer at a time.

Three paths behind one call, :func:`export_qat_weights`:

- **native**: a Megatron-Bridge with ``AutoBridge.export_hf_weights_modelopt`` (0.6+) exports
  itself; patchkit only checks the model first (QAT applied, every quantizer calibrated).
- **bridge**: an older Bridge streams the high-precision Hugging Face tensors (its mapping
  registry gathers TP shards, splits fused QKV and gate/up, gathers experts and pipeline stages);
  each tensor that comes from a quantized Megatron linear is quantized here, the way Bridge 0.6
  does it (blocks run along the input dimension, so splitting rows before or after quantizing
  gives the same bytes).
- **megatron**: no Bridge; Megatron names. Each rank announces its parameters once (global name,
  shape, amax); then, parameter by parameter in one global order, the tensor-parallel group
  gathers the shards, the lowest rank holding the result broadcasts it, and every rank quantizes
  and yields it. Small quantized weights are grouped into one kernel launch (``checkpoint_stream``);
  peak extra memory stays under twice the largest parameter.

The per-tensor amax of a tensor-parallel linear is the maximum over its shards (ModelOpt does not
sync NVFP4 weight amax across TP), which is the amax of the same weights at TP=1.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from torch import nn

from .._errors import QATExportError
from ._expert_layout import ExpertLayout, check_expert_layout, split_fused_experts
from ._export_finite import NonFiniteWeights
from ._export_names import export_order_key, global_names
from ._export_tensors import QuantSpec, StreamItem, checkpoint_stream, checkpoint_tensors, specs_on_device
from ._fused_experts import fuse_experts

logger = logging.getLogger(__name__)

W4A16_ALGO = "W4A16_NVFP4"
W4A4_ALGO = "NVFP4"


def unwrap_chunks(model_chunks: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    chunks = [model_chunks] if isinstance(model_chunks, nn.Module) else list(model_chunks)
    try:
        from megatron.core.utils import unwrap_model
    except ImportError:  # pragma: no cover - megatron is always there for real exports
        return chunks
    return [unwrap_model(chunk) for chunk in chunks]


def _is_nvfp4(quantizer: TensorQuantizer) -> bool:
    block_sizes = quantizer.block_sizes or {}
    num_bits = tuple(quantizer.num_bits) if isinstance(quantizer.num_bits, (tuple, list)) else quantizer.num_bits
    return num_bits == (2, 1) and block_sizes.get("scale_bits") == (4, 3) and bool(block_sizes.get(-1))


def _input_amax(module: nn.Module) -> torch.Tensor | None:
    quantizer = getattr(module, "input_quantizer", None)
    if not isinstance(quantizer, TensorQuantizer) or not quantizer.is_enabled:
        return None
    amax = getattr(quantizer, "_amax", None)
    return None if amax is None else amax.detach().float().cpu().reshape(())


def quant_specs(chunk: nn.Module) -> dict[str, QuantSpec]:
    """Local ``<module>.weight`` -> :class:`QuantSpec` for every linear whose weight quantizer is on.

    Raises :class:`QATExportError` for a quantizer the export cannot write: not NVFP4, or never
    calibrated (no amax: ModelOpt would write NaN scales), or calibrated on an all-zero or
    non-finite weight.
    """
    specs: dict[str, QuantSpec] = {}
    for name, module in chunk.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if not isinstance(quantizer, TensorQuantizer) or not quantizer.is_enabled:
            continue
        parameter = f"{name}.weight" if name else "weight"
        if not _is_nvfp4(quantizer):
            raise QATExportError(
                f"weight quantizer is not NVFP4 (num_bits={quantizer.num_bits}, block_sizes={quantizer.block_sizes})",
                layer=name, parameter=parameter, hint="export_qat_weights writes NVFP4 checkpoints only",
            )
        amax = getattr(quantizer, "_amax", None)
        if amax is None:
            raise QATExportError(
                "weight quantizer was never calibrated (no amax)", layer=name, parameter=parameter,
                hint="run mtq.quantize/apply_qat (weight-only NVFP4 calibrates from the weights) before exporting",
            )
        amax = amax.detach().float().cpu()
        if amax.numel() != 1 or not torch.isfinite(amax).all() or not bool((amax > 0).all()):
            raise QATExportError(
                f"weight quantizer amax is {amax.flatten().tolist()[:4]}; NVFP4 needs one finite positive amax",
                layer=name, parameter=parameter,
                hint="recalibrate (an all-zero weight has no NVFP4 scale; exclude such a layer from QAT)",
            )
        block_size = int(quantizer.block_sizes[-1])
        _check_block_shape(name, parameter, getattr(module, "weight", None), block_size)
        specs[parameter] = QuantSpec(block_size, amax.reshape(()), _input_amax(module))
    return specs


def _whole_input_dim(weight: torch.Tensor, expert: bool) -> int:
    """The input dimension of the whole (TP-gathered) weight: a row-parallel shard holds 1/tp of it."""
    columns = int(weight.shape[-1])
    if getattr(weight, "tensor_model_parallel", False) and getattr(weight, "partition_dim", None) == weight.dim() - 1:
        columns *= _group_size(_tp_group(expert))
    return columns


def _check_block_shape(layer: str, parameter: str, weight: object, block_size: int) -> None:
    """NVFP4 packs blocks of ``block_size`` along the input dimension; refuse a weight that has no whole blocks.

    ModelOpt's fake quantization pads a ragged last block, so such a model trains; its checkpoint
    format has no padding, so the export must refuse it before the first tensor, naming the layer.
    """
    if not isinstance(weight, torch.Tensor):
        return  # no ``weight`` (grouped-GEMM experts keep weight0, weight1...): nothing is exported under it
    if weight.dim() != 2:
        raise QATExportError(
            f"quantized weight has shape {list(weight.shape)}; NVFP4 export writes 2-D [out, in] weights only",
            layer=layer, parameter=parameter,
        )
    columns = _whole_input_dim(weight, expert=".experts." in layer)
    if block_size <= 0 or block_size % 2 or columns % block_size:
        raise QATExportError(
            f"weight of shape {list(weight.shape)} has an input dimension of {columns}, not a multiple of the "
            f"NVFP4 block size {block_size}",
            layer=layer, parameter=parameter,
            hint="NVFP4 checkpoints hold whole blocks along the input dimension: use hidden and FFN sizes that "
                 "are multiples of it, or leave the layer out of QAT (an ignore pattern)",
        )


def check_qat_model(chunks: list[nn.Module]) -> None:
    """Refuse a model that is not QAT-applied, before anything is exported."""
    if not any(isinstance(m, TensorQuantizer) for chunk in chunks for m in chunk.modules()):
        kinds = sorted({type(chunk).__name__ for chunk in chunks})
        raise QATExportError(
            f"model has no ModelOpt quantizers ({', '.join(kinds) or 'no chunks'})",
            hint="apply QAT first: patchkit.patches.modelopt.qat.apply_qat(model_chunks)",
        )


# --- Megatron names (no Bridge) ----------------------------------------------------------------


@dataclass
class _Entry:
    """One parameter of the whole model as the ranks announce it."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    partition_dim: int | None
    gated: bool
    spec: QuantSpec | None
    holders: list[int]


def _dist() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _tp_group(expert: bool) -> Any:
    """The (expert) tensor-parallel group, or None when Megatron's parallel state is not set up."""
    try:
        from megatron.core import parallel_state as mpu
    except ImportError:  # pragma: no cover
        return None
    if not mpu.model_parallel_is_initialized():
        return None
    if expert and hasattr(mpu, "get_expert_tensor_parallel_group"):
        return mpu.get_expert_tensor_parallel_group(check_initialized=False)
    return mpu.get_tensor_model_parallel_group()


def _group_size(group: Any) -> int:
    if group is None or not torch.distributed.is_initialized():
        return 1
    return torch.distributed.get_world_size(group)


def _local_parameters(chunks: list[nn.Module]) -> Iterator[tuple[str, torch.Tensor, nn.Module, QuantSpec | None]]:
    """(global name, tensor, chunk, spec) for each exported parameter of this rank's chunks."""
    for chunk in chunks:
        specs = quant_specs(chunk)
        named = [(n, p) for n, p in chunk.named_parameters() if "_quantizer" not in n]
        renamed = global_names(chunk, [n for n, _ in named])
        tied = bool(getattr(chunk, "share_embeddings_and_output_weights", False))
        for local, param in named:
            if tied and local == "output_layer.weight":
                continue  # the last stage's copy of the tied embedding; the embedding is exported
            yield renamed[local], param, chunk, specs.get(local)


def _announce(chunks: list[nn.Module]) -> tuple[list[_Entry], dict[str, torch.Tensor]]:
    rank, world = _dist()
    local: list[tuple[Any, ...]] = []
    tensors: dict[str, torch.Tensor] = {}
    for name, param, chunk, spec in _local_parameters(chunks):
        expert = ".experts." in name
        tp = _group_size(_tp_group(expert)) if getattr(param, "tensor_model_parallel", False) else 1
        dim = getattr(param, "partition_dim", None) if tp > 1 else None
        shape = list(param.shape)
        if dim is not None:
            shape[dim] *= tp
        gated = bool(getattr(chunk.config, "gated_linear_unit", False)) and name.endswith("linear_fc1.weight")
        local.append((name, tuple(shape), param.dtype, dim, gated, spec))
        tensors[name] = param
    announced: list[Any] = [local]
    if world > 1:
        announced = [None] * world
        torch.distributed.all_gather_object(announced, local)
    entries: dict[str, _Entry] = {}
    for holder, items in enumerate(announced):
        for name, shape, dtype, dim, gated, spec in items or ():
            entry = entries.get(name)
            if entry is None:
                entries[name] = _Entry(name, shape, dtype, dim, gated, spec, [holder])
                continue
            if entry.shape != shape or entry.dtype != dtype:
                raise QATExportError(
                    f"ranks disagree on the parameter: {entry.shape}/{entry.dtype} on rank {entry.holders[0]}, "
                    f"{shape}/{dtype} on rank {holder}", layer=name.rsplit(".", 1)[0], parameter=name,
                )
            entry.holders.append(holder)
            if spec is not None and entry.spec is not None:
                entry.spec = entry.spec.merged(spec)
    return sorted(entries.values(), key=lambda e: export_order_key(e.name)), tensors


def _gather_tp(tensor: torch.Tensor, entry: _Entry) -> torch.Tensor:
    """The whole parameter from this rank's shard: concatenated over the (expert) TP group."""
    if entry.partition_dim is None:
        return tensor.detach()
    group = _tp_group(".experts." in entry.name)
    size = _group_size(group)
    shards = [torch.empty_like(tensor) for _ in range(size)]
    torch.distributed.all_gather(shards, tensor.detach().contiguous(), group=group)
    if entry.gated:
        # Each shard of a SwiGLU fc1 is [gate_r; up_r]; the whole weight is [gate; up].
        halves = [shard.chunk(2, dim=entry.partition_dim) for shard in shards]
        shards = [h[0] for h in halves] + [h[1] for h in halves]
    return torch.cat(shards, dim=entry.partition_dim)


def _model_device(chunks: list[nn.Module]) -> torch.device:
    """Where the model's parameters live (its first parameter's device; the CPU for a model without
    any): the quantizer specs move there once, before the stream, instead of per tensor."""
    return next((p.device for chunk in chunks for p in chunk.parameters()), torch.device("cpu"))


def _megatron_export(chunks: list[nn.Module]) -> Iterator[tuple[str, torch.Tensor]]:
    rank, world = _dist()
    entries, local = _announce(chunks)
    device = _model_device(chunks)
    on_device = specs_on_device({e.name: e.spec for e in entries if e.spec is not None}, device)
    for entry in entries:
        entry.spec = on_device.get(entry.name)
    nonfinite = NonFiniteWeights()

    def parameters() -> Iterator[StreamItem]:
        for entry in entries:
            tensor = local.get(entry.name)
            if tensor is not None:
                tensor = _gather_tp(tensor, entry)
            if world > 1:
                source = min(entry.holders)
                if tensor is None:
                    tensor = torch.empty(entry.shape, dtype=entry.dtype, device=device)
                torch.distributed.broadcast(tensor.contiguous() if rank == source else tensor, src=source)
            assert tensor is not None  # every entry is held somewhere, and broadcast fills the rest
            # Held: a gathered or received copy, alike on every rank (the grouping must be too).
            yield entry.name, tensor, entry.spec, world > 1 or entry.partition_dim is not None
            del tensor

    yield from checkpoint_stream(parameters(), nonfinite)
    nonfinite.raise_if_any()


# --- Hugging Face names through a Bridge -------------------------------------------------------


def _model_bridge(bridge: Any) -> Any:
    return getattr(bridge, "_model_bridge", bridge)


def _registry(bridge: Any) -> Any:
    return _model_bridge(bridge).mapping_registry()


def _hf_names(mapping: Any) -> list[str]:
    hf = mapping.hf_param
    return [hf] if isinstance(hf, str) else list(hf.values())


def _global_specs(chunks: list[nn.Module]) -> dict[str, QuantSpec]:
    """Global Megatron weight name -> spec, merged over TP shards and gathered from every rank."""
    local: dict[str, QuantSpec] = {}
    for chunk in chunks:
        specs = quant_specs(chunk)
        renamed = global_names(chunk, list(specs))
        for name, spec in specs.items():
            local[renamed[name]] = spec
    _, world = _dist()
    if world == 1:
        return local
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, local)
    merged: dict[str, QuantSpec] = {}
    for specs in gathered:
        for name, spec in (specs or {}).items():
            merged[name] = spec if name not in merged else merged[name].merged(spec)
    return merged


def check_bridge_knows(chunks: list[nn.Module], bridge: Any) -> None:
    """Every exported parameter must map to a Hugging Face name, or the export would silently drop it."""
    registry = _registry(bridge)
    for chunk in chunks:
        names = [n for n, _ in chunk.named_parameters() if "_quantizer" not in n]
        for name in global_names(chunk, names).values():
            if registry.megatron_to_hf_lookup(name) is None:
                raise QATExportError(
                    f"the Bridge ({type(_model_bridge(bridge)).__name__}) maps no Hugging Face name to the parameter",
                    layer=name.rsplit(".", 1)[0], parameter=name,
                    hint="add a mapping to the model bridge's mapping_registry, or exclude the module",
                )


def _bridge_export(chunks: list[nn.Module], bridge: Any, layout: ExpertLayout) -> Iterator[tuple[str, torch.Tensor]]:
    check_bridge_knows(chunks, bridge)
    specs = _global_specs(chunks)
    registry = _registry(bridge)
    quantized: dict[str, QuantSpec] = {}
    for megatron_name, spec in specs.items():
        mapping = registry.megatron_to_hf_lookup(megatron_name)
        for hf_name in _hf_names(mapping):
            quantized[hf_name] = spec
    device = _model_device(chunks)
    quantized = specs_on_device(quantized, device)
    # Quantizer buffers have no mapping; Bridge 0.5+ lists them as ``None`` tasks, which its plain
    # export does not skip (its ModelOpt export filters them the same way).
    tasks = [task for task in _model_bridge(bridge).build_conversion_tasks(bridge.hf_pretrained, chunks) if task]
    stream = (
        (hf_name, tensor, quantized.get(hf_name))
        for hf_name, tensor in bridge.export_hf_weights(chunks, cpu=False, show_progress=False, conversion_tasks=tasks)
        if "_quantizer." not in hf_name
    )
    nonfinite = NonFiniteWeights()
    emit = functools.partial(checkpoint_tensors, nonfinite=nonfinite)
    if layout == "fused":
        num_experts = int(getattr(chunks[0].config, "num_moe_experts", None) or 0)
        yield from fuse_experts(stream, num_experts, emit)
    else:
        # Bridge's tensors are its own gathered copies: a group holds them.
        yield from checkpoint_stream(((name, tensor, spec, True) for name, tensor, spec in stream), nonfinite)
    nonfinite.raise_if_any()


# --- public -------------------------------------------------------------------------------------


def export_implementation(bridge: Any = None) -> str:
    """Which path :func:`export_qat_weights` takes: ``native``, ``bridge`` or ``megatron``."""
    if bridge is None:
        return "megatron"
    return "native" if callable(getattr(bridge, "export_hf_weights_modelopt", None)) else "bridge"


def export_qat_weights(
    model_chunks: nn.Module | Sequence[nn.Module],
    bridge: Any = None,
    *,
    native: bool | None = None,
    expert_layout: ExpertLayout = "per_expert",
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream ``(name, tensor)`` of a QAT-applied Megatron model in ModelOpt's NVFP4 checkpoint format.

    Per quantized linear: ``<m>.weight`` (uint8, two E2M1 values per byte, even element in the low
    nibble), ``<m>.weight_scale`` (FP8 E4M3 per block of 16), ``<m>.weight_scale_2`` (float32,
    amax / 2688) and ``<m>.input_scale`` when the input quantizer is on; every other parameter as
    it is. Names are Hugging Face names with a Megatron-Bridge ``AutoBridge`` (or model bridge),
    Megatron names without. Call it on every rank of the job: each yields the whole model, the
    same names in the same order.

    ``native``: with a Bridge that has ``export_hf_weights_modelopt`` (0.6+), ``None``/``True``
    use it and ``False`` uses patchkit's path; ``True`` without it raises. The model is checked
    (QAT applied, every weight quantizer calibrated, every parameter known to the Bridge) before
    the first tensor is produced.

    ``expert_layout`` (Hugging Face names only, with a Bridge): ``"per_expert"`` writes quantized MoE
    experts under their per-expert names (``experts.<e>.{gate,up,down}_proj.*``, as ModelOpt's
    checkpoints and vLLM's ``load_weights`` have them); ``"fused"`` stacks each layer's experts into
    vLLM's ``FusedMoE`` parameter names (``experts.w13_*``, ``experts.w2_*``), as Bridge 0.6's own
    export does; vLLM's ``load_weights`` skips those names without an error (use ``per_expert``, or
    ``split_fused_experts`` on the fused stream). Same bytes either way. Megatron names (no Bridge) are per expert
    (``local_experts.<e>.linear_fc1``); ``"fused"`` there, or any other value, raises
    :class:`QATExportError`.
    """
    layout = check_expert_layout(expert_layout)
    if layout == "fused" and bridge is None:
        raise QATExportError(
            "expert_layout='fused' needs Hugging Face names; without a Bridge the export writes Megatron names",
            hint="pass the model's AutoBridge, or use expert_layout='per_expert'",
        )
    chunks = unwrap_chunks(model_chunks)
    check_qat_model(chunks)
    for chunk in chunks:
        quant_specs(chunk)  # raises on an uncalibrated or non-NVFP4 quantizer, naming it
    path = export_implementation(bridge)
    if native and path != "native":
        raise QATExportError(
            f"native export asked for, but {type(bridge).__name__} has no export_hf_weights_modelopt",
            hint="it exists from Megatron-Bridge 0.6; pass native=None to use patchkit's export",
        )
    if path == "native" and native is False:
        path = "bridge"
    logger.info("patchkit: QAT NVFP4 export through %s", path)
    return _generate(chunks, bridge, path, layout)


def _generate(
    chunks: list[nn.Module], bridge: Any, path: str, layout: ExpertLayout
) -> Iterator[tuple[str, torch.Tensor]]:
    if path == "native":
        check_bridge_knows(chunks, bridge)
        # Bridge 0.6 writes quantized experts fused (modelopt_utils._FUSED_MOE_NVFP4_NAME_MAP).
        native = bridge.export_hf_weights_modelopt(chunks, quant_mode=quant_algo(chunks).lower(), show_progress=False)
        yield from native if layout == "fused" else split_fused_experts(native)
    elif path == "bridge":
        yield from _bridge_export(chunks, bridge, layout)
    else:
        yield from _megatron_export(chunks)


def quant_algo(chunks: list[nn.Module]) -> str:
    """``W4A16_NVFP4`` when no linear quantizes its input, ``NVFP4`` when they all do."""
    inputs = {spec.input_amax is not None for chunk in chunks for spec in quant_specs(chunk).values()}
    _, world = _dist()
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, sorted(inputs))
        inputs = {value for values in gathered for value in values or ()}
    if inputs == {True}:
        return W4A4_ALGO
    if len(inputs) > 1:
        raise QATExportError("some linears quantize their input and others do not; one checkpoint format cannot say so")
    return W4A16_ALGO
