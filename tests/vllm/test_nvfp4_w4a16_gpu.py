"""ModelOpt NVFP4 W4A16 (Marlin) linear refit: GPU only (``pytest -m gpu tests/vllm``).

``ModelOptNvFp4W4A16LinearMethod`` (vLLM 0.21-0.29) forces the Marlin kernel, which has no CPU
implementation. Marlin repacks weights into fresh Parameters and allocates a workspace, the case
where keeping kernel addresses matters most. Run on an H100 with vLLM 0.24.0's kernels (docs/verification.md,
"What ran on a GPU"); ``test_refit_gpu.py`` adds the MoE layer and a captured CUDA graph.
"""

from __future__ import annotations

import pytest
import torch
from nvfp4_helpers import dequantize, items, linear_checkpoint, process_weights_after_loading
from patchkit.patches.vllm.refit import refit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Marlin)"),
]


def checkpoint(seed: int, weight_scale_2: float) -> dict[str, torch.Tensor]:
    weights = linear_checkpoint("proj", seed=seed, out_features=256, in_features=128,
                                weight_scale_2=weight_scale_2, input_scale=1.0)
    del weights["proj.input_scale"]  # a W4A16 checkpoint has no activation scale
    return weights


class W4A16Model(torch.nn.Module):
    def __init__(self) -> None:
        from vllm.model_executor.layers.linear import ColumnParallelLinear
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

        super().__init__()
        quant_config = ModelOptNvFp4Config("W4A16_NVFP4", True, None, [], 16)
        self.proj = ColumnParallelLinear(128, 256, bias=False, quant_config=quant_config, prefix="proj",
                                         params_dtype=torch.bfloat16)

    def load_weights(self, weights):
        from vllm.model_executor.models.utils import AutoWeightsLoader

        return AutoWeightsLoader(self).load_weights(weights)


def assert_serves(model: W4A16Model, weights: dict[str, torch.Tensor]) -> None:
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    w = dequantize(weights["proj.weight"], weights["proj.weight_scale"], weights["proj.weight_scale_2"])
    reference = x.float() @ w.T
    out = model.proj(x.cuda())[0].float().cpu()
    torch.testing.assert_close(out, reference, rtol=2e-2, atol=2e-2 * reference.abs().max().item())


def test_w4a16_marlin_refits_into_the_same_kernel_tensors(vllm_config: object) -> None:
    import patchkit

    with patchkit.applied("vllm.nvfp4_refit"):
        with torch.device("cuda"):
            model = W4A16Model()
        weights_a, weights_b = checkpoint(0, 0.01), checkpoint(1, 0.02)
        model.load_weights(items({k: v.cuda() for k, v in weights_a.items()}))
        process_weights_after_loading(model)
        assert_serves(model, weights_a)
        tensors = {n: t.data_ptr() for n, t in model.proj.named_parameters()}
        tensors.update({n: t.data_ptr() for n, t in vars(model.proj).items() if isinstance(t, torch.Tensor)})
        for step in range(10):
            weights = weights_b if step % 2 == 0 else weights_a
            with refit(model):
                model.load_weights(items({k: v.cuda() for k, v in weights.items()}))
            assert_serves(model, weights)
            now = {n: t.data_ptr() for n, t in model.proj.named_parameters()}
            now.update({n: t.data_ptr() for n, t in vars(model.proj).items() if isinstance(t, torch.Tensor)})
            assert now == tensors
