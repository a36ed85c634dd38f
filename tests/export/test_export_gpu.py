"""On CUDA: the export equals ModelOpt's own export, and dequantizes to what ModelOpt's CUDA kernel trained.

Marker ``gpu`` (skipped without CUDA). The QAT model uses ModelOpt's own fake-quant kernel (no
patchkit CPU backend), weights and quantizers on the GPU; the export runs on the GPU.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_cuda_export_equals_modelopt_export_and_the_kernels_fake_quant(megatron_gpu, moe):
    from export_models import build_gpt, quantized_modules
    from modelopt.torch.export import quant_utils
    from patchkit.patches.modelopt.qat import apply_qat, export_qat_weights
    from patchkit.patches.modelopt.qat._checks._nvfp4_grid import at_rounding_tie
    from patchkit.patches.modelopt.qat._nvfp4_pack import dequantize_nvfp4

    model = build_gpt(moe, dtype=torch.bfloat16, seed=3).cuda()
    (model,) = apply_qat([model], backend=None)  # ModelOpt's CUDA/Triton kernel
    exported = dict(export_qat_weights([model]))
    checked = 0
    for name, module, quantizer in quantized_modules(model):
        fmt = quant_utils.get_quantization_format(module)
        scale = quant_utils.get_weight_scaling_factor(module)
        scale_2 = quant_utils.get_weight_scaling_factor_2(module)
        packed = quant_utils.to_quantized_weight(module.weight.detach(), scale, fmt, scale_2, 16)
        assert exported[f"{name}.weight"].is_cuda
        assert torch.equal(exported[f"{name}.weight"], packed), name
        assert torch.equal(exported[f"{name}.weight_scale"].view(torch.uint8), scale.view(torch.uint8)), name
        assert torch.equal(exported[f"{name}.weight_scale_2"], scale_2), name
        with torch.no_grad():
            trained = quantizer(module.weight)
        restored = dequantize_nvfp4(exported[f"{name}.weight"], exported[f"{name}.weight_scale"], scale_2)
        # The Triton kernel divides with an approximate fp32 division, so a value exactly on an E2M1
        # rounding tie may land one step away, and its bf16 store may round one bf16 ulp apart from
        # torch (docs/modelopt-qat.md "GPU check"). Off ties, nothing may differ by more than one ulp.
        restored = restored.to(trained.dtype)
        tie = at_rounding_tie(module.weight.detach(), scale_2.float() * 6.0 * 448.0)
        ulp = (torch.nextafter(trained.abs(), torch.tensor(float("inf"), dtype=trained.dtype,
                                                          device=trained.device)) - trained.abs()).float()
        beyond = ((restored.float() - trained.float()).abs() > ulp) & ~tie
        assert not beyond.any(), (name, int(beyond.sum()))
        checked += 1
    assert checked >= 4
