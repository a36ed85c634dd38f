"""The quantization config that goes with an exported checkpoint, derived from the model itself.

Which modules are excluded is read from the quantizers the trainer actually has (a linear whose
weight quantizer is off, or that has none, is excluded), not from the ignore patterns it was asked
for, so the config agrees with the export — and with the trainer's MTP choice — by construction.
The two shapes vLLM reads: ``hf_quant_config.json`` (``{"producer", "quantization"}``) and the
``quantization_config`` entry of ``config.json`` (``quant_method: modelopt``; its exclusions under
``ignore``, the key vLLM reads there, and ``exclude_modules``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from torch import nn

from ._export import _dist, _hf_names, _registry, check_qat_model, quant_algo, quant_specs, unwrap_chunks
from ._export_names import export_order_key, global_names


def _linear_modules(chunk: nn.Module) -> dict[str, bool]:
    """Module name -> whether its weight is NVFP4-quantized, for every module with a matrix weight."""
    result: dict[str, bool] = {}
    for name, module in chunk.named_modules():
        weight = getattr(module, "weight", None)
        if not name or not isinstance(weight, torch.Tensor) or weight.dim() != 2 or isinstance(module, nn.Embedding):
            continue
        if type(module).__name__ == "VocabParallelEmbedding":
            continue
        quantizer = getattr(module, "weight_quantizer", None)
        result[name] = isinstance(quantizer, TensorQuantizer) and quantizer.is_enabled
    return result


def _excluded(chunks: list[nn.Module], bridge: Any) -> list[str]:
    excluded: set[str] = set()
    registry = _registry(bridge) if bridge is not None else None
    for chunk in chunks:
        linears = _linear_modules(chunk)
        renamed = global_names(chunk, [f"{name}.weight" for name in linears])
        for name, quantized in linears.items():
            if quantized:
                continue
            megatron = renamed[f"{name}.weight"]
            if registry is None:
                excluded.add(megatron[: -len(".weight")])
                continue
            mapping = registry.megatron_to_hf_lookup(megatron)
            for hf in _hf_names(mapping) if mapping is not None else [megatron]:
                excluded.add(hf[: -len(".weight")] if hf.endswith(".weight") else hf)
    _, world = _dist()
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, sorted(excluded))
        excluded = {name for names in gathered for name in names or ()}
    return sorted(excluded, key=export_order_key)


def export_qat_config(model_chunks: nn.Module | Sequence[nn.Module], bridge: Any = None) -> dict[str, Any]:
    """``{"hf_quant_config": ..., "quantization_config": ...}`` for the checkpoint :func:`export_qat_weights` writes.

    Collective under ``torch.distributed`` (every rank must call it); every rank gets the same dict.
    """
    chunks = unwrap_chunks(model_chunks)
    check_qat_model(chunks)
    block_sizes = {spec.block_size for chunk in chunks for spec in quant_specs(chunk).values()}
    algo = quant_algo(chunks)
    group_size = min(block_sizes) if block_sizes else 16
    excluded = _excluded(chunks, bridge)
    try:
        from importlib.metadata import version

        producer_version = version("nvidia-modelopt")
    except Exception:  # pragma: no cover - metadata missing in odd installs
        producer_version = "unknown"
    quantization = {"quant_algo": algo, "kv_cache_quant_algo": None, "group_size": group_size,
                    "exclude_modules": excluded}
    return {
        "hf_quant_config": {"producer": {"name": "modelopt", "version": producer_version},
                            "quantization": dict(quantization)},
        # vLLM reads the exclusions of config.json's entry from ``ignore`` (0.24 and 0.29 only from
        # there: with ``exclude_modules`` alone they quantized the output layer and the routers);
        # 0.33 reads either. Both are written.
        "quantization_config": {"quant_method": "modelopt", **quantization, "ignore": list(excluded)},
    }
