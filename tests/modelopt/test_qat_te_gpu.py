"""On a CUDA GPU with TransformerEngine: QAT on megatron-core's TransformerEngine layer spec.

Every RL framework trains Megatron with TE layers (verl and slime pin TE 2.16.1, NeMo-RL 2.14.1).
Marked ``gpu``; skipped without CUDA or without a real TransformerEngine. A tiny dense GPT and a
tiny MoE GPT (with an MTP layer) are built with ``get_gpt_layer_with_transformer_engine_spec``;
``apply_qat`` (ModelOpt's TE plugin, its CUDA kernel) quantizes the TE linears, including the
fused ``TELayerNormColumnParallelLinear``; forward and backward run and every quantized weight is
on the NVFP4 grid.
"""

from __future__ import annotations

import pytest
import torch
from megatron_gpu_setup import cuda_and_te_marks
from qat_fixtures import build_te_gpt

pytestmark = cuda_and_te_marks()


@pytest.mark.parametrize("num_experts", [None, 4], ids=["dense", "moe"])
def test_qat_on_the_transformer_engine_spec_trains(megatron_gpu: None, num_experts: int | None) -> None:
    from modelopt.torch.quantization.nn import TensorQuantizer
    from patchkit.patches.modelopt.qat import apply_qat
    from qat_fixtures import assert_blocks_on_fp4_grid, batch

    model = build_te_gpt(num_experts)
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    assert type(qkv).__name__ == "TELayerNormColumnParallelLinear"
    apply_qat(model, backend=None)
    enabled = [n for n, m in model.named_modules()
               if n.endswith("weight_quantizer") and isinstance(m, TensorQuantizer) and m.is_enabled]
    assert "decoder.layers.0.self_attention.linear_qkv.weight_quantizer" in enabled, enabled
    assert not any(n.startswith(("output_layer", "mtp.")) for n in enabled)
    inputs = {k: v.cuda() for k, v in batch().items()}
    loss = model(**inputs)
    assert torch.isfinite(loss).all()
    loss.float().mean().backward()
    assert qkv.weight.grad is not None and qkv.weight.grad.abs().sum() > 0
    for name in enabled:
        module = model.get_submodule(name.rsplit(".", 1)[0])
        with torch.no_grad():
            assert_blocks_on_fp4_grid(module.weight.float().cpu(), module.weight_quantizer(module.weight).float().cpu())
