"""Self-check of the ModelOpt patch: NVFP4 fake quantization through ModelOpt's own quantizer, on CPU.

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by ``tests/modelopt``. The weight goes
through a ModelOpt ``TensorQuantizer`` configured for NVFP4 with the patch's backend (the way
``build_qat_config`` configures it while the patch is applied), and the result is judged twice:
on the FP4 grid (blocks of 16, at most 8 magnitudes each, all E2M1 values times one scale), and
equal, element for element, to the installed release's own CPU rule (``NVFP4QTensor.quantize`` then
``dequantize``). With ``--device cuda`` it is also compared with ModelOpt's CUDA kernel.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._constants import CPU_BACKEND_NAME
from ._nvfp4_grid import assert_blocks_on_fp4_grid, at_rounding_tie

#: A block of 16 whose values (block scale 1) sit on each E2M1 rounding boundary, both signs.
TIES = (6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0)
NVFP4 = {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)}}


def sample_weight(rows: int = 64, columns: int = 256, seed: int = 0) -> torch.Tensor:
    """Magnitudes over four decades (many block scales), one outlier, one all-zero block, one block of ties.

    The outlier 42 makes the per-tensor scale 42 / (6 * 448) = 1/64 exactly, so the tie block (largest
    magnitude 6) gets the block scale 1 and its values lie exactly on E2M1 decision boundaries, where
    only the release's tie rule decides.
    """
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, columns, generator=generator) * torch.logspace(-3, 1, columns)
    weight[3, 17] = 42.0
    weight[5, :16] = 0.0
    weight[7, :16] = torch.tensor(TIES)
    return weight


def fake_quantize(weight: torch.Tensor, backend: str | None) -> torch.Tensor:
    """ModelOpt's ``TensorQuantizer`` (NVFP4, dynamic blocks of 16) on ``weight``, through ``backend``."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    quantizer = TensorQuantizer().to(weight.device)
    quantizer.set_from_attribute_config({**NVFP4, **({"backend": backend} if backend else {})})
    with torch.no_grad():
        return quantizer(weight)


def release_round_trip(weight: torch.Tensor) -> torch.Tensor:
    """The installed ModelOpt's own NVFP4 rule on CPU: ``NVFP4QTensor.quantize`` then ``dequantize``.

    ModelOpt < 0.44 asks ``fp4_compatible()`` (is the GPU a Blackwell?) before honouring
    ``try_tensorrt=False``; on a machine without CUDA the true answer is no, so it is answered so.
    """
    from modelopt.torch.quantization.qtensor import NVFP4QTensor, nvfp4_tensor

    with _fp4_incompatible(nvfp4_tensor):
        packed, scale, double_scale = NVFP4QTensor.quantize(weight, 16, try_tensorrt=False)
        return packed.dequantize(dtype=weight.dtype, scale=scale, double_scale=double_scale, block_sizes={-1: 16})


@contextlib.contextmanager
def _fp4_incompatible(module: Any) -> Any:
    if not hasattr(module, "fp4_compatible"):
        yield
        return
    original = module.fp4_compatible
    module.fp4_compatible = lambda: False
    try:
        yield
    finally:
        module.fp4_compatible = original


def check_nvfp4_cpu_fake_quant(context: CheckContext) -> None:
    """ModelOpt's quantizer with the CPU backend puts a weight on the NVFP4 grid, by the release's rule."""
    from modelopt.torch.quantization.nn.modules.tensor_quantizer import is_registered_quant_backend

    expect(is_registered_quant_backend(CPU_BACKEND_NAME), "ModelOpt has the CPU NVFP4 backend registered",
           CPU_BACKEND_NAME, "not registered")
    weight = sample_weight()
    ours = fake_quantize(weight, CPU_BACKEND_NAME)
    expect(not torch.equal(ours, weight), "NVFP4 fake quantization changes a weight that is not on the grid",
           "a changed tensor", "the input unchanged")
    assert_blocks_on_fp4_grid(weight, ours)
    reference = release_round_trip(weight)
    differing = int((ours != reference).sum())
    expect(differing == 0, "the CPU backend equals the installed ModelOpt's NVFP4 rule (NVFP4QTensor quantize/"
           f"dequantize), elements differing of {weight.numel()}", 0,
           f"{differing} (largest difference {float((ours - reference).abs().max()):.3g})")
    if context.device == "cuda":
        _compare_with_cuda_kernel(weight)


def _compare_with_cuda_kernel(weight: torch.Tensor) -> None:
    """Off exact rounding ties, the CPU backend and ModelOpt's CUDA kernel agree bit for bit (float32)."""
    ours = fake_quantize(weight, CPU_BACKEND_NAME)
    theirs = fake_quantize(weight.cuda(), None).cpu()
    tie = at_rounding_tie(weight, weight.abs().amax())
    differing = int(((ours != theirs) & ~tie).sum())
    expect(differing == 0, "the CPU backend equals ModelOpt's CUDA kernel away from E2M1 rounding ties, "
           f"elements differing of {weight.numel()}", 0, differing)
