"""ModelOpt's own Hugging Face export of a Megatron model, and the bit-for-bit comparison with patchkit's.

ModelOpt writes a quantized megatron-core GPT as a Hugging Face checkpoint with
``export_mcore_gpt_to_hf``; its ``GPTModelExporter`` builds that state dict in memory
(``.state_dict``) from its own rule book per architecture (``modelopt.torch.export.plugins``): q/k/v
sliced out of ``linear_qkv`` and gate/up out of ``linear_fc1`` after quantizing the fused weight,
and on TransformerEngine's spec the layer norms fused into ``TELayerNormColumnParallelLinear``
(``layer_norm_weight``) written as ``input_layernorm.weight`` and ``post_attention_layernorm.weight``
(its ``fused_input_layernorm`` / ``fused_pre_mlp_layernorm`` rules). That is the reference here:
independent of Megatron-Bridge, whose mapping patchkit's Hugging Face names come from.

The exporter reads the architecture from a Hugging Face config on disk and casts every unquantized
tensor (and every weight before quantizing it) to ``dtype``, so it is given the model's own dtype.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import torch


def modelopt_hf_state_dict(model: torch.nn.Module, hf_config: Any, dtype: torch.dtype,
                           directory: Path) -> dict[str, torch.Tensor]:
    """ModelOpt's Hugging Face state dict of the bare QAT-applied ``model`` (``GPTModelExporter``).

    The exporter keeps one dict per decoder layer (``layer_state_dicts``, what ``save_pretrained``
    writes shard by shard; the embedding sits in the first, the final norm and output layer in the
    last); their union is the checkpoint."""
    from modelopt.torch.export.unified_export_megatron import GPTModelExporter

    hf_config.save_pretrained(directory)
    with contextlib.redirect_stdout(io.StringIO()):  # the exporter prints its router dtype
        exporter = GPTModelExporter(model, str(directory), dtype=dtype)
        layers = exporter.layer_state_dicts
    merged: dict[str, torch.Tensor] = {}
    for layer in layers.values():
        assert not set(layer) & set(merged), sorted(set(layer) & set(merged))
        merged.update(layer)
    return merged


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach().cpu()
    return tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor


def held_in_other_dtype(ours: dict[str, torch.Tensor], dtype: torch.dtype) -> frozenset[str]:
    """Names of unquantized floating tensors of ``ours`` that are not ``dtype`` (scales excluded)."""
    return frozenset(n for n, t in ours.items() if t.dtype.is_floating_point and t.dtype != dtype
                     and t.dtype != torch.float8_e4m3fn and not n.endswith(("weight_scale", "weight_scale_2")))


def assert_equal_bit_for_bit(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], *,
                             recast: frozenset[str] = frozenset()) -> dict[str, int]:
    """Same names, and every tensor the same dtype, shape and bytes. Returns counts by kind of tensor.

    ``recast``: names of unquantized tensors the model holds in another dtype than the export's.
    ModelOpt casts every unquantized tensor to its export ``dtype``; patchkit exports them as the
    trainer holds them. Those must be listed (exactly), and equal after the same cast.
    """
    assert sorted(ours) == sorted(theirs), (sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours)))
    counts = {"packed": 0, "scales": 0, "plain": 0}
    other_dtype = set()
    for name, theirs_tensor in theirs.items():
        mine = ours[name]
        if mine.dtype != theirs_tensor.dtype and mine.dtype.is_floating_point and name in recast:
            other_dtype.add(name)
            mine = mine.to(theirs_tensor.dtype)
        assert (mine.dtype, tuple(mine.shape)) == (theirs_tensor.dtype, tuple(theirs_tensor.shape)), (
            name, mine.dtype, tuple(mine.shape), theirs_tensor.dtype, tuple(theirs_tensor.shape))
        assert torch.equal(as_bytes(mine), as_bytes(theirs_tensor)), name
        kind = ("packed" if mine.dtype == torch.uint8 else
                "scales" if name.endswith(("weight_scale", "weight_scale_2")) else "plain")
        counts[kind] += 1
    assert other_dtype == set(recast), sorted(set(recast) - other_dtype)
    return counts
