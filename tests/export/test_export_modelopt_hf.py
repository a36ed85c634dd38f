"""Hugging Face names: patchkit's export through a Bridge equals ModelOpt's own Hugging Face export.

Runs where Megatron-Bridge is installed (environment ``export-bridge-0.6``; CPU, local layer spec).
The reference is ModelOpt's ``GPTModelExporter`` (what ``export_mcore_gpt_to_hf`` writes), not the
Bridge: names, dtypes, shapes and bytes of every tensor, norms, embeddings, router and output layer
included. The same comparison on TransformerEngine's layer spec, where the layer norms live inside
``TELayerNormColumnParallelLinear``, is ``test_export_modelopt_hf_te_gpu.py`` (CUDA).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed", allow_module_level=True)

from bridge_models import build, hf_config  # noqa: E402
from modelopt_hf_export import assert_equal_bit_for_bit, held_in_other_dtype, modelopt_hf_state_dict  # noqa: E402
from patchkit.patches.modelopt.qat import apply_qat, export_qat_weights  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_hf_names_equal_modelopts_own_hf_export(megatron_cpu, cpu_backend, tmp_path, moe, dtype):
    bridge, model = build(moe, dtype=dtype)
    apply_qat([model])
    theirs = modelopt_hf_state_dict(model, hf_config(moe), dtype, tmp_path)
    assert "model.layers.0.input_layernorm.weight" in theirs
    assert "model.layers.1.post_attention_layernorm.weight" in theirs
    ours = dict(export_qat_weights([model], bridge, native=False))
    # The local spec makes its norms in fp32 whatever params_dtype says; ModelOpt casts them to bf16.
    recast = held_in_other_dtype(ours, dtype)
    norms = {f"model.layers.{i}.{norm}.weight" for i in range(2) for norm in
             ("input_layernorm", "post_attention_layernorm", "self_attn.q_norm", "self_attn.k_norm")}
    assert recast == (norms | {"model.norm.weight"} if dtype == torch.bfloat16 else set())
    counts = assert_equal_bit_for_bit(ours, theirs, recast=recast)
    assert counts["packed"] > 0 and counts["plain"] > 0
    # Bridge 0.6's own export (patchkit's native path, split per expert) writes the same.
    assert_equal_bit_for_bit(dict(export_qat_weights([model], bridge)), theirs, recast=recast)
