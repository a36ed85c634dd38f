"""ModelOpt NVFP4 fused MoE refitted through patchkit, on real vLLM 0.29 (CPU, EMULATION backend).

The layer is built by vLLM's ``FusedMoEFactory`` with ``ModelOptNvFp4Config`` and loaded through
``RoutedExperts.load_weights`` from per-expert ModelOpt checkpoint names. vLLM's NVFP4 MoE forward
needs Triton (GPU), so the checks read what the experts kernel consumes: the processed kernel
tensors, dequantised, against the reference dequantisation of the checkpoint.
"""

from __future__ import annotations

import pytest
from moe_helpers import WEIGHTS_A, WEIGHTS_B, assert_serves, kernel_view, loaded_model
from nvfp4_helpers import items, process_weights_after_loading
from patchkit.patches.vllm.refit import RefitError, refit


def test_moe_ten_refits_serve_each_checkpoint_in_the_same_kernel_tensors(nvfp4_refit_patch: None) -> None:
    model = loaded_model(WEIGHTS_A)
    assert_serves(model, WEIGHTS_A)
    before = kernel_view(model)
    method = model.routed.quant_method
    kernel = method.moe_kernel
    for step in range(10):
        weights = WEIGHTS_B if step % 2 == 0 else WEIGHTS_A
        with refit(model):
            model.load_weights(items(weights))
        assert_serves(model, weights)
        assert kernel_view(model) == before
        # The modular kernel built at first load (what a captured graph runs) is kept, and the
        # scales it reads are the layer's refitted tensors.
        assert method.moe_kernel is kernel
        assert kernel.fused_experts.w1_scale_val.data_ptr() == model.routed.w13_weight_scale.data_ptr()


def test_moe_wrong_expert_shape_is_refused_and_previous_weights_kept(nvfp4_refit_patch: None) -> None:
    model = loaded_model(WEIGHTS_A)
    before = kernel_view(model)
    bad = dict(WEIGHTS_B)
    bad["experts.2.down_proj.weight"] = bad["experts.2.down_proj.weight"][:32].contiguous()
    with pytest.raises(RefitError) as caught:
        with refit(model):
            model.load_weights(items(bad))
    # vLLM's MoE loader copies the short tensor into part of the expert without complaint;
    # patchkit's element count catches it.
    assert caught.value.layer == "experts.routed_experts"
    assert caught.value.parameter == "w2_weight"
    assert "(4, 64, 16) torch.uint8" in str(caught.value) and "(32, 16)" in str(caught.value)
    assert_serves(model, WEIGHTS_A)
    assert kernel_view(model) == before


def test_moe_without_patchkit_a_second_load_is_refused_or_wrong(cpu_nvfp4_kernels: None) -> None:
    """Processing reshaped the per-expert scales ([experts, 2] -> [experts]; input scales to scalars)."""
    model = loaded_model(WEIGHTS_A)
    with pytest.raises(Exception) as caught:
        model.load_weights(items(WEIGHTS_B))
        process_weights_after_loading(model)
        assert_serves(model, WEIGHTS_B)
    assert not isinstance(caught.value, RefitError)
