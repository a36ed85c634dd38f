"""The opt-in pure-torch NVFP4 backend against ModelOpt's own NVFP4 arithmetic, on CPU.

ModelOpt's fake-quant kernel is CUDA-only (see ``test_nvfp4_gpu.py`` for that comparison), but its
real-quantization path, ``NVFP4QTensor.quantize`` followed by ``dequantize``, is plain torch and
computes the same two-level scales and E2M1 rounding: the backend must reproduce it exactly.
"""

from __future__ import annotations

import pytest
import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from modelopt.torch.quantization.nn.modules.tensor_quantizer import is_registered_quant_backend
from modelopt.torch.quantization.qtensor import NVFP4QTensor, nvfp4_tensor
from patchkit.patches.modelopt.qat import CPU_BACKEND_NAME

import patchkit


@pytest.fixture
def cpu_backend_module():
    with patchkit.applied("modelopt.nvfp4_cpu_fake_quant"):
        from patchkit.patches.modelopt.qat import _nvfp4_cpu_fake_quant as _nvfp4_cpu_backend

        yield _nvfp4_cpu_backend


@pytest.fixture
def modelopt_round_trip(monkeypatch):
    """``NVFP4QTensor.quantize`` then ``dequantize``: upstream's CPU-capable NVFP4 arithmetic.

    ModelOpt < 0.44 asks ``fp4_compatible()`` (is the GPU a Blackwell?) before honouring
    ``try_tensorrt=False``; on a machine without CUDA the true answer is no, so it is answered so.
    """
    monkeypatch.setattr(nvfp4_tensor, "fp4_compatible", lambda: False, raising=False)

    def round_trip(weight: torch.Tensor) -> torch.Tensor:
        packed, scale, double_scale = NVFP4QTensor.quantize(weight, 16, try_tensorrt=False)
        return packed.dequantize(dtype=weight.dtype, scale=scale, double_scale=double_scale, block_sizes={-1: 16})

    return round_trip


def _weights(dtype: torch.dtype) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(64, 256, generator=generator) * torch.logspace(-3, 1, 256)
    outliers = torch.randn(32, 128, generator=generator)
    outliers[3, 17] = 40.0
    zero_block = torch.randn(16, 64, generator=generator)
    zero_block[:, :16] = 0.0
    return [w.to(dtype) for w in (spread, outliers, zero_block, torch.randn(4, 8, 32, generator=generator))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_backend_equals_modelopts_nvfp4_round_trip(cpu_backend_module, modelopt_round_trip, dtype):
    for weight in _weights(dtype):
        ours = cpu_backend_module.nvfp4_fake_quantize(weight, weight.float().abs().amax(), 16)
        theirs = modelopt_round_trip(weight)
        assert ours.dtype == weight.dtype and ours.shape == weight.shape
        assert torch.equal(ours, theirs), (ours.float() - theirs.float()).abs().max()


def test_ties_round_as_the_kernel(cpu_backend_module):
    # global amax 2688 = 6 * 448 makes the per-tensor scale 1; the block max 6 makes the block scale 1.
    block = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, 0.0, 0.2, 0.3, 2.9, 4.2])
    out = cpu_backend_module.nvfp4_fake_quantize(block[None], torch.tensor(2688.0), 16)[0]
    expected = [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -0.0, -1.0, -4.0, 0.0, 0.0, 0.5, 3.0, 4.0]
    assert out.tolist() == expected


def test_straight_through_gradient(cpu_backend_module):
    weight = torch.randn(8, 32, requires_grad=True)
    quantizer = TensorQuantizer()
    block_sizes = {-1: 16, "type": "dynamic", "scale_bits": (4, 3)}
    quantizer.set_from_attribute_config({"num_bits": (2, 1), "block_sizes": block_sizes, "backend": CPU_BACKEND_NAME})
    out = quantizer(weight)
    assert not torch.equal(out, weight)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))


def test_backend_refuses_a_format_it_does_not_implement(cpu_backend_module):
    quantizer = TensorQuantizer()
    quantizer.set_from_attribute_config({"num_bits": 8, "axis": None, "backend": CPU_BACKEND_NAME})
    with pytest.raises(NotImplementedError, match=r"NVFP4 only .* quantizer asks for num_bits=8"):
        quantizer(torch.randn(4, 16))


def test_patch_registers_the_backend_and_revert_removes_it():
    assert not is_registered_quant_backend(CPU_BACKEND_NAME)
    with patchkit.applied("modelopt.nvfp4_cpu_fake_quant") as records:
        assert [(r.id, r.state.value) for r in records] == [("modelopt.nvfp4_cpu_fake_quant", "applied")]
        assert is_registered_quant_backend(CPU_BACKEND_NAME)
    assert not is_registered_quant_backend(CPU_BACKEND_NAME)


def test_backend_is_opt_in():
    # A private engine holding only this patch, so apply_all installs nothing else in the process.
    from patchkit.patches.modelopt.qat import nvfp4_cpu_fake_quant as declaration

    engine = patchkit.Engine([patchkit.Registered(declaration.PATCHES[0], declaration.__package__)])
    (record,) = engine.apply_all(environ={})
    assert record.state.value == "skipped" and record.reason.value == "opt_in"
    assert not is_registered_quant_backend(CPU_BACKEND_NAME)
