"""`patchkit doctor` on the real ModelOpt: the NVFP4 CPU backend's self-check verifies it through ModelOpt's
own quantizer, and fails when the backend does not quantize or quantizes by another rule."""

from __future__ import annotations

import pytest
import torch

import patchkit
from patchkit import ConfigError
from patchkit.doctor import FAILED, VERIFIED, run

PATCH = "modelopt.nvfp4_cpu_fake_quant"


pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.fixture
def backend():
    with patchkit.applied(PATCH):
        from patchkit.patches.modelopt.qat import _nvfp4_cpu_fake_quant as _nvfp4_cpu_backend

        yield _nvfp4_cpu_backend


def verdict_of(device: str = "cpu"):
    (verdict,) = run([PATCH], device=device)[0]
    return verdict


def test_nvfp4_cpu_backend_check_is_verified(backend):
    verdict = verdict_of()
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("modelopt.nvfp4_cpu_fake_quant")
def test_nvfp4_check_fails_when_the_backend_returns_its_input(backend, monkeypatch):
    monkeypatch.setattr(backend, "nvfp4_fake_quantize", lambda inputs, *args, **kwargs: inputs.clone())
    verdict = verdict_of()
    assert verdict.verdict == FAILED
    assert verdict.message == ("NVFP4 fake quantization changes a weight that is not on the grid: "
                               "expected a changed tensor, found the input unchanged")


@pytest.mark.breaks("modelopt.nvfp4_cpu_fake_quant")
def test_nvfp4_check_fails_off_the_fp4_grid(backend, monkeypatch):
    original = backend.nvfp4_fake_quantize

    def off_grid(inputs, *args, **kwargs):
        out = original(inputs, *args, **kwargs)
        out[0, 0] = out[0, :16].abs().max() * (2.5 / 6.0)  # 2.5 is no E2M1 value
        return out

    monkeypatch.setattr(backend, "nvfp4_fake_quantize", off_grid)
    verdict = verdict_of()
    assert verdict.verdict == FAILED
    assert "off the E2M1 grid: expected 0 blocks off the grid, found 1 of 1024" in verdict.message, verdict.message


@pytest.mark.breaks("modelopt.nvfp4_cpu_fake_quant")
def test_nvfp4_check_fails_when_ties_round_by_another_rule(backend, monkeypatch):
    """Round half away from zero instead of the kernel's tie rule: on the grid, but not the release's rule."""
    magnitudes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

    def nearest(abs_scaled):
        distance = (abs_scaled.unsqueeze(-1) - magnitudes).abs()
        # the last of equally near magnitudes: ties go up
        index = distance.size(-1) - 1 - distance.flip(-1).argmin(-1)
        return magnitudes[index]

    monkeypatch.setattr(backend, "fp4_round_magnitude", nearest)
    verdict = verdict_of()
    assert verdict.verdict == FAILED
    assert "equals the installed ModelOpt's NVFP4 rule" in verdict.message and "expected 0, found " in verdict.message


@pytest.mark.breaks("modelopt.nvfp4_cpu_fake_quant")
def test_nvfp4_check_fails_when_the_backend_is_not_registered(backend):
    from modelopt.torch.quantization.nn.modules.tensor_quantizer import unregister_quant_backend
    from patchkit.patches.modelopt.qat import CPU_BACKEND_NAME

    unregister_quant_backend(CPU_BACKEND_NAME)
    try:
        verdict = verdict_of()
    finally:
        backend.install()
    assert verdict.verdict == FAILED and "has the CPU NVFP4 backend registered" in verdict.message


def test_nvfp4_check_on_cuda_without_a_gpu_says_so_before_any_check_runs(backend):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: tests/modelopt/test_doctor_gpu.py runs the CUDA comparison")
    unavailable = r"--device='cuda' is unavailable \(torch .* (built without CUDA|sees no GPU)\)"
    with pytest.raises(ConfigError, match=unavailable):
        verdict_of("cuda")
