"""``vllm.nvfp4_marlin_w4a16`` on a GPU: vLLM's real Marlin kernels serve ModelOpt NVFP4 layers as W4A16.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere). The dense layers are vLLM's ``ColumnParallelLinear``/``RowParallelLinear`` and the MoE
layer its fused-MoE factory, all with ``ModelOptNvFp4Config`` for an ``NVFP4`` (W4A4) checkpoint.
Checked: with the patch the layers take vLLM's W4A16 path, the CUDA kernels that run are Marlin's
(read from torch's profiler), and the outputs equal the product of the bf16 activations and the
dequantised weights within the bf16 bound of ``gpu_kernels``. Without the patch, what vLLM picks on
this GPU is asserted for Hopper (compute capability 9.x): Marlin for both, because vLLM's W4A4 NVFP4
kernels (CUTLASS, FlashInfer) need compute capability 10.0 or FlashInfer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from gpu_kernels import (
    GPU,
    HIDDEN,
    INTERMEDIATE,
    DenseLayers,
    MoELayer,
    activations,
    assert_within,
    cuda_kernels_run,
    export,
    fake_quantized,
    installed,
    linear_expected,
    loaded,
    moe_expected,
    moe_forward,
    trained_dense,
    trained_moe,
)
from patchkit.patches.vllm._nvfp4_checkpoint import kernel_name

import patchkit

pytestmark = GPU

logger = logging.getLogger(__name__)
MARLIN = "vllm.nvfp4_marlin_w4a16"


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def flashinfer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None


@pytest.fixture
def marlin_patch() -> Iterator[None]:
    with installed(MARLIN):
        yield


def test_with_the_patch_dense_layers_run_marlin_and_equal_the_w4a16_product(
        marlin_patch: None, vllm_config: object) -> None:
    checkpoint = export(trained_dense(0))
    with torch.device("cuda"):
        model = loaded(DenseLayers("NVFP4"), checkpoint)
    assert model.quant_method_name == "W4A16_NVFP4"
    assert kernel_name(model.up) == kernel_name(model.down) == "MarlinNvFp4LinearKernel"
    for layer, features in (("up", HIDDEN), ("down", INTERMEDIATE)):
        x = activations(33, features, seed=1)
        kernels = cuda_kernels_run(lambda layer=layer, x=x: getattr(model, layer)(x))
        assert any("marlin" in name.lower() for name in kernels), kernels
        out = getattr(model, layer)(x)[0]
        ratio = assert_within(out, linear_expected(x, fake_quantized(checkpoint, layer)), layer)
        logger.info("%s: Marlin kernels %s, largest error %.3f of the bound", layer, kernels, ratio)


def test_with_the_patch_the_moe_layer_runs_marlin_and_equals_the_w4a16_product(
        marlin_patch: None, vllm_config: object) -> None:
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

    checkpoint = export(trained_moe(0))
    with torch.device("cuda"):
        model = loaded(MoELayer("NVFP4"), checkpoint)
    method = model.routed.quant_method
    assert method.use_a16 and method.nvfp4_backend == NvFp4MoeBackend.MARLIN
    x = activations(40, HIDDEN, seed=2)
    logits = activations(40, 4, seed=3)
    kernels = cuda_kernels_run(lambda: moe_forward(model, x, logits, vllm_config))
    assert any("marlin" in name.lower() for name in kernels), kernels
    out = moe_forward(model, x, logits, vllm_config)
    ratio = assert_within(out, moe_expected(x, logits, checkpoint), "moe")
    logger.info("moe: kernels %s, largest error %.3f of the bound", kernels, ratio)


def test_the_bound_catches_a_wrong_weight(marlin_patch: None, vllm_config: object) -> None:
    """The check can fail: the layer served against another checkpoint's weights is out of bounds."""
    served, other = export(trained_dense(0)), export(trained_dense(1))
    with torch.device("cuda"):
        model = loaded(DenseLayers("NVFP4"), served)
    x = activations(33, HIDDEN, seed=1)
    assert_within(model.up(x)[0], linear_expected(x, fake_quantized(served, "up")), "up")
    with pytest.raises(AssertionError, match="bf16 bound"):
        assert_within(model.up(x)[0], linear_expected(x, fake_quantized(other, "up")), "up")


@pytest.mark.skipif(not hopper(), reason="what vLLM picks without the patch is asserted for Hopper")
def test_without_the_patch_hopper_already_serves_nvfp4_through_marlin(vllm_config: object) -> None:
    """vLLM 0.24 on Hopper: no W4A4 NVFP4 kernel runs there (CUTLASS FP4 needs compute capability 10.0,
    FlashInfer's need FlashInfer), so an ``NVFP4`` checkpoint is served by Marlin, W4A16 in effect,
    through the W4A4 methods; the patch changes the method, not the kernel or the result."""
    from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import NvFp4MoeBackend

    assert not flashinfer_installed()
    dense_checkpoint, moe_checkpoint = export(trained_dense(0)), export(trained_moe(0))
    with torch.device("cuda"):
        dense = loaded(DenseLayers("NVFP4"), dense_checkpoint)
        moe = loaded(MoELayer("NVFP4"), moe_checkpoint)
    assert dense.quant_method_name == "NVFP4"
    assert type(dense.up.quant_method).__name__ == "ModelOptNvFp4LinearMethod"
    assert kernel_name(dense.up) == "MarlinNvFp4LinearKernel"
    assert not moe.routed.quant_method.use_a16
    assert moe.routed.quant_method.nvfp4_backend == NvFp4MoeBackend.MARLIN
    x, xm, logits = activations(33, HIDDEN, seed=1), activations(40, HIDDEN, seed=2), activations(40, 4, seed=3)
    unpatched = dense.up(x)[0], moe_forward(moe, xm, logits, vllm_config)
    with patchkit.applied(MARLIN), torch.device("cuda"):
        dense_a16 = loaded(DenseLayers("NVFP4"), dense_checkpoint)
        moe_a16 = loaded(MoELayer("NVFP4"), moe_checkpoint)
    assert type(dense_a16.up.quant_method).__name__ == "ModelOptNvFp4W4A16LinearMethod"
    assert torch.equal(dense_a16.up(x)[0], unpatched[0])
    assert torch.equal(moe_forward(moe_a16, xm, logits, vllm_config), unpatched[1])
