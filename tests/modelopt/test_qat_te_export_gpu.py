"""On a CUDA GPU with TransformerEngine: the QAT export of megatron-core's TE layer spec, fp32 and bf16.

Marked ``gpu``; skipped without CUDA or without a real TransformerEngine. A tiny dense GPT and a
tiny MoE GPT with an MTP layer are built with ``get_gpt_layer_with_transformer_engine_spec``
(megatron-core 0.19.2), quantized by ``apply_qat`` with ModelOpt's TE plugin and CUDA kernel, run
forward and backward, and exported by ``export_qat_weights`` (Megatron names, no Bridge). Every
quantized TE linear, the fused ``TELayerNormColumnParallelLinear`` included, must equal ModelOpt's
own export functions (``modelopt.torch.export.quant_utils``, what ``export_hf_checkpoint`` calls
per linear) bit for bit, and the fused layer-norm weights (``linear_qkv.layer_norm_weight``,
``linear_fc1.layer_norm_weight``) must come out unchanged under their own names.

bf16: ``params_dtype=torch.bfloat16`` and ``bf16=True`` leave one parameter in fp32, the learned
absolute position embedding (a plain ``torch.nn.Embedding``), so a bare model's embedding output is
fp32 and TE's ``LayerNormLinear`` refuses it (its parameters are bf16; "Data types for parameters
must match when outside of autocasted region"). Megatron trains bf16 models wrapped in
``Float16Module``, which casts them; so does this test, and then the embedding output is bf16. The
dtypes seen are appended to the file named by ``PATCHKIT_GPU_REPORT``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
import torch
from megatron_gpu_setup import cuda_and_te_marks
from qat_fixtures import build_te_gpt

pytestmark = cuda_and_te_marks()


def build_verl_like_te_gpt(num_experts: int | None, dtype: torch.dtype) -> Any:
    """GQA, gated MLPs and a narrower expert MLP, in ``dtype``."""
    return build_te_gpt(num_experts, num_query_groups=2, moe_ffn_hidden_size=64 if num_experts else None,
                        gated_linear_unit=True, params_dtype=dtype, bf16=dtype == torch.bfloat16)


def as_trained(model: Any) -> Any:
    """The chunk as Megatron trains it: bf16 models wrapped in ``Float16Module`` (which casts every
    parameter to bf16, and the first stage's float inputs)."""
    from megatron.core.transformer.module import Float16Module

    return Float16Module(model.config, model) if model.config.bf16 else model


def _report(**fields: Any) -> None:
    path = os.environ.get("PATCHKIT_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(fields) + "\n")


def _modelopt_export(module: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from modelopt.torch.export import quant_utils

    fmt = quant_utils.get_quantization_format(module)
    assert fmt == quant_utils.QUANTIZATION_W4A16_NVFP4, fmt
    scale = quant_utils.get_weight_scaling_factor(module)
    scale_2 = quant_utils.get_weight_scaling_factor_2(module)
    block = quant_utils.get_weight_block_size(module)
    return quant_utils.to_quantized_weight(module.weight.detach(), scale, fmt, scale_2, block), scale, scale_2


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == torch.float8_e4m3fn:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_experts", [None, 4], ids=["dense", "moe-mtp"])
def test_te_spec_export_equals_modelopts_export(megatron_gpu: None, num_experts: int | None,
                                                dtype: torch.dtype) -> None:
    from patchkit.patches.modelopt.qat import apply_qat, export_qat_weights
    from qat_fixtures import batch

    model = build_verl_like_te_gpt(num_experts, dtype)
    # Why a bare bf16 GPTModel runs its first TE layer on fp32 input: the learned absolute position
    # embedding is a plain torch.nn.Embedding, made in torch's default dtype whatever params_dtype says,
    # so word (bf16) + position (fp32) embeddings add up to fp32. Megatron's training wraps the model
    # in Float16Module, which casts it.
    other_dtype = sorted(n for n, p in model.named_parameters() if p.dtype != dtype)
    _report(test="te_export_bare_model", experts=num_experts, params=str(dtype), other_dtype_params=other_dtype)
    chunk = as_trained(model)
    assert {p.dtype for p in model.parameters()} == {dtype}
    apply_qat(chunk, backend=None)
    seen: dict[str, torch.dtype] = {}

    def note_embedding(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        seen["embedding"] = out.dtype

    hook = model.embedding.register_forward_hook(note_embedding)
    inputs = {k: v.cuda() for k, v in batch().items()}
    loss = chunk(**inputs)
    hook.remove()
    loss.float().mean().backward()
    _report(test="te_export", experts=num_experts, params=str(dtype), embedding_out=str(seen["embedding"]),
            loss=str(loss.dtype))
    assert seen["embedding"] == dtype
    assert torch.isfinite(loss).all()

    exported = dict(export_qat_weights([chunk]))
    modules = dict(model.named_modules())
    quantized = [n for n, m in modules.items() if getattr(getattr(m, "weight_quantizer", None), "is_enabled", False)]
    fused = [n for n in quantized if isinstance(getattr(modules[n], "layer_norm_weight", None), torch.Tensor)]
    assert fused, "the TE spec has fused layer-norm linears"
    assert not any(n.startswith(("mtp.", "output_layer")) for n in quantized)
    for name in quantized:
        packed, scale, scale_2 = _modelopt_export(modules[name])
        assert exported[f"{name}.weight"].dtype == torch.uint8, name
        assert _same(exported[f"{name}.weight"], packed), name
        assert _same(exported[f"{name}.weight_scale"], scale), name
        assert _same(exported[f"{name}.weight_scale_2"], scale_2), name
        assert f"{name}.input_scale" not in exported, name
    norms = [n for n, _ in model.named_parameters() if n.endswith(".layer_norm_weight")]
    assert {n.rsplit(".", 1)[0] for n in norms} >= set(fused)
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[0] not in quantized:
            assert _same(exported[name], param.detach()), name
    expected = {n for n, _ in model.named_parameters()} | {
        f"{m}.{s}" for m in quantized for s in ("weight_scale", "weight_scale_2")}
    assert set(exported) == expected
    _report(test="te_export", experts=num_experts, params=str(dtype), quantized=len(quantized), fused=len(fused),
            layer_norm_weights=norms, tensors=len(exported))
    assert other_dtype == ([] if dtype == torch.float32 else ["embedding.position_embeddings.weight"])
