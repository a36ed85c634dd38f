"""On CUDA with TransformerEngine: Hugging Face names on the TE layer spec equal ModelOpt's own HF export.

Marked ``gpu``; skipped without CUDA, a real TransformerEngine or Megatron-Bridge. A tiny Qwen3
(dense, and MoE with 4 experts) is built by Megatron-Bridge's provider on
``get_gpt_layer_with_transformer_engine_spec``, so each layer's input layer norm lives in
``self_attention.linear_qkv`` (``TELayerNormColumnParallelLinear.layer_norm_weight``) and, in the
dense model, the pre-MLP layer norm in ``mlp.linear_fc1``. ``apply_qat`` quantizes it with
ModelOpt's CUDA kernel; ``export_qat_weights(model, bridge)`` (patchkit's path, and Bridge 0.6's
own ``export_hf_weights_modelopt`` split per expert) must equal ModelOpt's ``GPTModelExporter``
(``export_mcore_gpt_to_hf``'s state dict) name for name and bit for bit, the fused layer norms
written as ``model.layers.N.input_layernorm.weight`` and ``post_attention_layernorm.weight``.
fp32 and bf16 (every TE parameter, norms included, is made in ``params_dtype``, so no tensor
needs ModelOpt's cast to the export dtype; the local spec's fp32 norms do, see
``test_export_modelopt_hf.py``). What was exported is appended to the file named by ``PATCHKIT_GPU_REPORT``.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from megatron_gpu_setup import REQUIRES_TE

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    REQUIRES_TE,
    pytest.mark.skipif(importlib.util.find_spec("megatron.bridge") is None, reason="needs Megatron-Bridge"),
]


def _report(**fields: object) -> None:
    path = os.environ.get("PATCHKIT_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(fields) + "\n")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_te_spec_hf_names_equal_modelopts_own_hf_export(megatron_gpu, tmp_path, moe, dtype):
    from bridge_models import build_te, hf_config
    from modelopt_hf_export import assert_equal_bit_for_bit, held_in_other_dtype, modelopt_hf_state_dict
    from patchkit.patches.modelopt.qat import apply_qat, export_qat_weights

    bridge, model = build_te(moe, dtype=dtype)
    layer = model.decoder.layers[0]
    assert type(layer.self_attention.linear_qkv).__name__ == "TELayerNormColumnParallelLinear"
    assert type(layer.input_layernorm).__name__ == "IdentityOp"
    fc1_fused = type(getattr(layer.mlp, "linear_fc1", None)).__name__ == "TELayerNormColumnParallelLinear"
    assert fc1_fused == (not moe)  # an MoE layer keeps its own pre-MLP norm (TENorm)
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    other_dtype = sorted(n for n, p in model.named_parameters() if p.dtype != dtype)
    apply_qat([model], backend=None)
    layers = range(model.config.num_layers)
    fused = {f"model.layers.{i}.input_layernorm.weight":
             f"decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight" for i in layers}
    if fc1_fused:
        fused |= {f"model.layers.{i}.post_attention_layernorm.weight":
                  f"decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight" for i in layers}

    theirs = modelopt_hf_state_dict(model, hf_config(moe), dtype, tmp_path)
    ours = dict(export_qat_weights([model], bridge, native=False))
    recast = held_in_other_dtype(ours, dtype)
    _report(test="te_hf_export", moe=moe, dtype=str(dtype), other_dtype_params=other_dtype, recast=sorted(recast))
    counts = assert_equal_bit_for_bit(ours, theirs, recast=recast)
    params = dict(model.named_parameters())
    for hf_name, megatron_name in fused.items():
        assert torch.equal(ours[hf_name], params[megatron_name].detach()), hf_name
    assert counts["packed"] > 0
    native = dict(export_qat_weights([model], bridge))  # Bridge 0.6's own export, split per expert
    assert_equal_bit_for_bit(native, theirs, recast=recast)
    _report(test="te_hf_export", moe=moe, dtype=str(dtype), tensors=len(ours), fused_norms=sorted(fused), **counts)
    # TE makes every parameter, its norms included, in params_dtype: nothing is recast.
    assert other_dtype == [] and not recast
