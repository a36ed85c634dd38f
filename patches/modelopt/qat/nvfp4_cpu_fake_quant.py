"""``modelopt.nvfp4_cpu_fake_quant``: Pure-torch NVFP4 fake-quant backend so ModelOpt QAT runs without CUDA
(CPU CI).
"""

from __future__ import annotations

from patchkit import Call, Patch, Variant

PATCHES = (
    Patch(
        id="modelopt.nvfp4_cpu_fake_quant",
        self_check="._checks.nvfp4_cpu_fake_quant:check_nvfp4_cpu_fake_quant",
        summary="Pure-torch NVFP4 fake-quant backend so ModelOpt QAT runs without CUDA (CPU CI).",
        why=(
            "ModelOpt fake-quantizes NVFP4 only with its Triton kernel or CUDA extension, so QAT code "
            "cannot be exercised in CPU CI. The backend reproduces the Triton kernel's arithmetic "
            "(FP8 E4M3 block scales, E2M1 rounding with the kernel's tie rules) and is checked against "
            "it on a GPU."
        ),
        upstream=(
            "https://github.com/NVIDIA/Model-Optimizer/blob/0.47.0/modelopt/torch/kernels/quantization/"
            "common/nvfp4_quant.py (register_quant_backend in modelopt/torch/quantization/nn/modules/"
            "tensor_quantizer.py)"
        ),
        removal="Remove if ModelOpt ships a CPU implementation of NVFP4 fake quantization.",
        version_modules={"nvidia-modelopt": "modelopt"},
        opt_in=True,
        variants=(
            Variant(
                requires={"nvidia-modelopt": ">=0.43,<0.48"},
                installs=(
                    Call(
                        "._nvfp4_cpu_fake_quant:install",
                        "._nvfp4_cpu_fake_quant:uninstall",
                        after="modelopt.torch.quantization",
                    ),
                ),
            ),
            Variant(
                # 0.48's kernel zeroes only a zero block scale (0.47 replaced scales below 1e-5 by 1).
                requires={"nvidia-modelopt": ">=0.48.0rc0,<0.49"},
                installs=(
                    Call(
                        "._nvfp4_cpu_fake_quant:install_v048",
                        "._nvfp4_cpu_fake_quant:uninstall",
                        after="modelopt.torch.quantization",
                    ),
                ),
            ),
        ),
    ),
)
