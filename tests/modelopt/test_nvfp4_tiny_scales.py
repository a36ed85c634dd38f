"""The CPU backend's rule for degenerate NVFP4 scales, per ModelOpt release, on CPU.

ModelOpt's fake-quant kernel changed in 0.48 (read from the wheels): 0.47's
``gemm/fp4_kernel_hopper.py`` replaces a block scale below 1e-5 with 1 (``tl.where(block_max_quant >=
1e-5, block_max_quant, 1.0)``), so a block of small values rounds to zero; 0.48 quantizes such blocks
(``common/nvfp4_quant.py::nvfp4_scalar_quant``) and zeroes only a block whose FP8 scale is exactly
zero. The expected values below are worked out by hand from those two sources; the kernels themselves
run only on a GPU (``test_nvfp4_gpu.py::test_tiny_blocks_match_modelopts_cuda_kernel``).
"""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from packaging.version import Version
from patchkit.patches.modelopt.qat import _nvfp4_cpu_fake_quant as backend

import patchkit

MODELOPT = Version(importlib.metadata.version("nvidia-modelopt"))
GLOBAL_AMAX = torch.tensor(1e-4)
#: The per-tensor scale both kernels compute: amax / (6 * 448), in float32.
GLOBAL_SCALE = GLOBAL_AMAX / 2688.0


def _block(value: float) -> torch.Tensor:
    return torch.full((1, 16), value)


def test_small_block_is_zeroed_by_the_047_rule_and_quantized_by_the_048_rule():
    # Block amax 4e-5 under global amax 1e-4: 4e-5 / (6 * scale) = 179.2 rounds to E4M3 176, so the
    # block scale is 176 * scale = 6.5e-6, below 1e-5. 0.47 uses 1 instead: 4e-5 / 1 rounds to 0.
    # 0.48 keeps it: 4e-5 / 6.5e-6 = 6.1 rounds to the E2M1 maximum 6.
    block = _block(4e-5)
    block_scale = 176.0 * GLOBAL_SCALE
    assert block_scale.item() < 1e-5
    assert torch.equal(backend.nvfp4_fake_quantize(block, GLOBAL_AMAX, 16, backend.RULE_047), torch.zeros(1, 16))
    expected = torch.full((1, 16), (6.0 * block_scale).item())
    torch.testing.assert_close(backend.nvfp4_fake_quantize(block, GLOBAL_AMAX, 16, backend.RULE_048), expected,
                               rtol=0, atol=0)
    torch.testing.assert_close(backend.nvfp4_fake_quantize(-block, GLOBAL_AMAX, 16, backend.RULE_048), -expected,
                               rtol=0, atol=0)


def test_a_block_whose_fp8_scale_underflows_to_zero_is_zeroed_by_both_rules():
    # 1e-10 / (6 * scale) = 4.5e-4 is below half the smallest E4M3 subnormal (2**-9): the scale is 0.
    block = _block(1e-10)
    for rule in backend.RULES:
        assert torch.equal(backend.nvfp4_fake_quantize(block, GLOBAL_AMAX, 16, rule), torch.zeros(1, 16)), rule


def test_blocks_of_one_row_follow_the_rule_independently():
    row = torch.cat([_block(1e-4), _block(4e-5), _block(1e-10), _block(0.0)], dim=1)
    old = backend.nvfp4_fake_quantize(row, GLOBAL_AMAX, 16, backend.RULE_047)
    new = backend.nvfp4_fake_quantize(row, GLOBAL_AMAX, 16, backend.RULE_048)
    assert torch.equal(old[:, :16], new[:, :16])  # a normal block: same scale (448 * scale), same values
    torch.testing.assert_close(new[:, :16], _block(1e-4), rtol=1e-6, atol=0)
    assert torch.equal(old[:, 16:32], torch.zeros(1, 16)) and (new[:, 16:32] > 0).all()
    assert torch.equal(old[:, 32:], torch.zeros(1, 32)) and torch.equal(new[:, 32:], torch.zeros(1, 32))


@pytest.mark.parametrize("global_amax", [0.0, float("nan"), float("inf")])
def test_degenerate_global_amax_gives_the_unit_block_scale_under_both_rules(global_amax):
    # 0.48: an invalid global scale gives block scale 1; 0.47: 0/NaN become 1e-12 and the resulting
    # block scale (at most 448e-12) is below 1e-5, so 1 again. 0.3 / 1 rounds to 0.5, 2.6 to 3.
    row = torch.tensor([[0.3, -2.6] + [0.0] * 14])
    expected = torch.tensor([[0.5, -3.0] + [0.0] * 14])
    for rule in backend.RULES:
        if rule == backend.RULE_047 and global_amax == float("inf"):
            continue  # 0.47 divides by an infinite scale: not a case its kernel defines
        got = backend.nvfp4_fake_quantize(row, torch.tensor(global_amax), 16, rule)
        assert torch.equal(got, expected), (rule, got)


def test_unknown_rule_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unit_below_1e-5"):
        backend.nvfp4_fake_quantize(_block(1.0), torch.tensor(1.0), 16, "round_up")


def test_the_applied_variant_follows_the_installed_release():
    expected = backend.RULE_048 if MODELOPT >= Version("0.48.0rc0") else backend.RULE_047
    assert backend.installed_release_rule() == expected
    with patchkit.applied("modelopt.nvfp4_cpu_fake_quant") as records:
        assert [r.state.value for r in records] == ["applied"]
        assert backend.installed_rule == expected
        from modelopt.torch.quantization.nn import TensorQuantizer

        quantizer = TensorQuantizer()
        quantizer.set_from_attribute_config({
            "num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)},
            "backend": backend.BACKEND_NAME,
        })
        quantizer.amax = GLOBAL_AMAX
        with torch.no_grad():
            got = quantizer(_block(4e-5))
    assert backend.installed_rule is None
    small_block_kept = bool((got > 0).all())
    assert small_block_kept == (expected == backend.RULE_048)
