"""MTP postprocess on megatron-core's TransformerEngine layer spec equals the local-spec results (CUDA, real TE).

Marked ``gpu``; skipped without CUDA or without a real TransformerEngine. The tiny GPT of
``tiny_gpt`` (local spec, 1-2 MTP depths) is rebuilt with ``get_gpt_layer_with_transformer_engine_spec``
and given the same weights: TE fuses each layer norm into the linear after it, so
``input_layernorm.*`` becomes ``self_attention.linear_qkv.layer_norm_*`` and ``pre_mlp_layernorm.*``
becomes ``mlp.linear_fc1.layer_norm_*``, in the decoder and in every MTP layer. With
``megatron.mtp_postprocess`` applied, both models return the same logits and attach the same per-depth
MTP losses (fp32; TE's fused attention and GEMMs round differently from the local ones: on an H100
the logits differed by up to 1.9e-4, 0.9% of them by more than 1e-4, hence a tolerance of 1e-3).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from megatron_gpu_setup import REQUIRES_TE
from megatron_gpu_setup import te_twin as shared_te_twin
from test_mtp_postprocess_gpu import cuda_batch, cuda_model

import patchkit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.usefixtures("empty_mtp_tracker", "megatron_gpu"),
    REQUIRES_TE,
]
def te_twin(local: Any) -> Any:
    """The same model (MTP layers included) on the TE spec, loaded with ``local``'s weights."""
    return shared_te_twin(local)


@pytest.mark.parametrize("mtp_num_layers", [1, 2])
def test_te_spec_mtp_losses_and_logits_equal_the_local_specs(
        attached_mtp_losses: list[torch.Tensor], mtp_num_layers: int) -> None:
    from mtp_checks import run

    local = cuda_model(mtp_num_layers)
    twin = te_twin(local)
    assert type(twin.decoder.layers[0].self_attention.linear_qkv).__name__ == "TELayerNormColumnParallelLinear"
    batch = cuda_batch()
    with patchkit.applied("megatron.mtp_postprocess"):
        local_logits = run(local, batch)
        local_losses = list(attached_mtp_losses)
        attached_mtp_losses.clear()
        te_logits = run(twin, batch)
    assert len(local_losses) == len(attached_mtp_losses) == mtp_num_layers
    torch.testing.assert_close(te_logits, local_logits, atol=1e-3, rtol=1e-3)
    for depth, (te, ours) in enumerate(zip(attached_mtp_losses, local_losses, strict=True)):
        assert te.abs().sum() > 0, depth
        torch.testing.assert_close(te, ours, atol=1e-3, rtol=1e-3, msg=f"depth {depth + 1}")
