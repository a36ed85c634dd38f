"""The fused Triton NVFP4 pack gives the torch path's bits (which are ModelOpt's, see test_export_bitexact).

The GPU tests (marker ``gpu``) cover what could make a fused kernel round differently: exact
rounding ties at every E2M1 boundary, zero, tiny, huge and infinite values, -0.0, bf16/fp16/fp32
inputs, row counts that leave a partial program, leading dimensions and non-contiguous weights.
(NaN weights are out of scope: torch's block maximum propagates NaN where the kernel's may not;
neither gives a NaN weight a meaningful NVFP4 encoding.)
"""

from __future__ import annotations

import pytest
import torch
from patchkit.patches.modelopt.qat._nvfp4_pack import E2M1_MAX, E4M3_MAX, quantize_nvfp4

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _same_bits(weight: torch.Tensor, amax: torch.Tensor) -> None:
    expected = quantize_nvfp4(weight, amax, backend="torch")
    fused = quantize_nvfp4(weight, amax, backend="triton")
    assert torch.equal(fused[0], expected[0]), f"{(fused[0] != expected[0]).sum()} packed bytes differ"
    assert torch.equal(fused[1].view(torch.uint8), expected[1].view(torch.uint8)), "block scales differ"
    assert torch.equal(fused[2], expected[2])


def test_backend_triton_refuses_a_cpu_weight_and_an_unknown_backend_is_an_error():
    weight = torch.randn(4, 32)
    with pytest.raises(ValueError, match="CUDA weight"):
        quantize_nvfp4(weight, weight.abs().amax(), backend="triton")
    with pytest.raises(ValueError, match="backend must be"):
        quantize_nvfp4(weight, weight.abs().amax(), backend="cuda")  # type: ignore[arg-type]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 16), (3, 48), (257, 4096), (2, 129, 64)], ids=str)
def test_random_weights_pack_to_the_same_bits(dtype, shape):
    torch.manual_seed(sum(shape))
    weight = (torch.randn(shape) * torch.logspace(-6, 2, shape[-1])).to(dtype).cuda()
    _same_bits(weight, weight.float().abs().amax())


@pytest.mark.gpu
@needs_cuda
def test_rounding_ties_zero_tiny_huge_infinite_and_negative_zero_blocks_pack_to_the_same_bits():
    # amax 6 * 448 makes weight_scale_2 exactly 1, and a block whose largest magnitude is 6 has a
    # block scale of exactly 1: its values land exactly on the E2M1 boundaries (the ties).
    amax = torch.tensor(E2M1_MAX * E4M3_MAX)
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0])
    infinite = ties.clone()
    infinite[3] = float("inf")
    rows = [ties, ties.flip(0), torch.zeros(16), torch.full((16,), -0.0), torch.full((16,), 1e-30),
            ties * 2.0**-12, ties * 2.0**-20, ties * 1e6, ties * 1e30, infinite, -infinite]
    weight = torch.stack(rows).repeat(40, 2).cuda()
    _same_bits(weight, amax)
    _same_bits(weight.to(torch.bfloat16), amax)


@pytest.mark.gpu
@needs_cuda
def test_non_contiguous_weight_and_auto_backend():
    from patchkit.patches.modelopt.qat import _nvfp4_pack_triton

    weight = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16).t()  # (256, 64), not contiguous
    amax = weight.float().abs().amax()
    _same_bits(weight, amax)
    calls = []
    original = _nvfp4_pack_triton.quantize_rows
    try:
        _nvfp4_pack_triton.quantize_rows = lambda *a: calls.append(1) or original(*a)
        quantize_nvfp4(weight, amax)
    finally:
        _nvfp4_pack_triton.quantize_rows = original
    assert calls, "backend='auto' runs the fused kernel for a CUDA weight"


def _nonfinite_flag(weight: torch.Tensor, backend: str) -> bool:
    flags: list[torch.Tensor] = []
    quantize_nvfp4(weight, torch.tensor(E2M1_MAX * E4M3_MAX), backend=backend, nonfinite=flags)  # type: ignore[arg-type]
    (flag,) = flags
    assert flag.dim() == 0 and flag.device == weight.device
    return bool(flag)


def _poisoned(value: float, where: tuple[int, int], shape: tuple[int, int] = (300, 4096)) -> torch.Tensor:
    weight = torch.randn(shape)
    weight[where] = value
    return weight


POISON = [
    pytest.param(float("nan"), (0, 0), id="nan-first"),
    pytest.param(float("inf"), (299, 4095), id="inf-last"),
    pytest.param(float("-inf"), (150, 17), id="-inf-middle"),
]


@pytest.mark.parametrize(("value", "where"), POISON)
def test_the_torch_pass_flags_a_nan_or_infinite_weight(value, where):
    assert _nonfinite_flag(_poisoned(value, where), "torch")
    assert not _nonfinite_flag(torch.randn(300, 4096) * 1e30, "torch")  # huge is not infinite
    assert not _nonfinite_flag(torch.randn(5, 64), "torch")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("value", "where"), POISON)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_fused_kernel_flags_a_nan_or_infinite_weight(value, where, dtype):
    weight = _poisoned(value, where).to(dtype).cuda()
    assert _nonfinite_flag(weight, "triton")
    assert not _nonfinite_flag((torch.randn(300, 4096) * 1e30).to(dtype).cuda(), "triton")
    assert not _nonfinite_flag(torch.randn(3, 48, dtype=dtype).cuda(), "triton")  # a partial program
    if value == value:  # NaN blocks differ between the paths (NaN clamps differently); the export refuses them
        _same_bits(weight, torch.tensor(E2M1_MAX * E4M3_MAX))  # the flag changes no output bit


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("amax_factor", [1.0, 0.5, 1e-3, 1e6])
def test_weights_over_eighty_binades_pack_to_the_same_bits(dtype, amax_factor):
    # The fused kernel compares |x| with per-block thresholds instead of dividing: weights spread over
    # 2**-40 .. 2**40, with the amax they have, with one too small (codes saturate) and too large.
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(1024, 4096, generator=generator) * torch.exp2(
        torch.randint(-40, 40, (1024, 4096), generator=generator).float())
    weight = weight.to(dtype).cuda()
    _same_bits(weight, weight.float().abs().amax() * amax_factor)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_ties_at_every_block_scale_and_extreme_divisors_pack_to_the_same_bits(dtype):
    # Every tie scaled by a power of two per block (block scales that are powers of two); then
    # subnormal weights and quotients, and amaxes so small or large that the divisor leaves the
    # thresholds' exact range and the kernel divides instead.
    amax = torch.tensor(E2M1_MAX * E4M3_MAX)
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0, 0.0])
    generator = torch.Generator().manual_seed(2)
    scaled_ties = ties.repeat(4096, 1) * torch.exp2(torch.randint(-8, 7, (4096, 1), generator=generator).float())
    _same_bits(scaled_ties.to(dtype).cuda(), amax)
    base = torch.randn(512, 1024, generator=generator)
    spread = base * torch.exp2(torch.randint(-140, 0, base.shape, generator=generator).float())
    for weight, weight_amax in [(base * 1e-39, amax), (base * 1e-39, (base * 1e-39).abs().amax()), (spread, amax),
                                (base * 1e30, torch.tensor(1e-3)), (base * 1e38, torch.tensor(1e-30)),
                                (base, torch.tensor(1e-38)), (base, torch.tensor(3e38))]:
        _same_bits(weight.to(dtype).cuda(), weight_amax)


def _group_case(device: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Weights of many shapes (a partial program, leading dimensions, a non-contiguous one, one with no
    rows) with their amaxes, a too-small and a too-large amax among them (saturated codes, the
    dividing fallback); a NaN in one, an infinity in another."""
    generator = torch.Generator().manual_seed(5)
    shapes = [(3, 48), (257, 4096), (2, 129, 64), (0, 32), (64, 1024), (1, 16), (96, 256)]
    weights = [torch.randn(shape, generator=generator) * 10.0 ** float(i - 3) for i, shape in enumerate(shapes)]
    weights[4][5, 7] = float("nan")
    weights[6][0, 0] = float("-inf")
    weights.append(torch.randn(256, 64, generator=generator).t())  # (64, 256), not contiguous
    amaxes = [w.abs().amax() if w.numel() else torch.tensor(1.0) for w in weights]
    amaxes[1] = amaxes[1] * 1e-3
    amaxes[2] = torch.tensor(1e-38)
    amaxes[5] = torch.tensor(3e38)
    amaxes[4] = torch.tensor(2.0)
    amaxes[6] = torch.tensor(7.0)
    return [w.to(device) for w in weights], amaxes


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda]),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_grouped_quantization_gives_each_weights_own_bits_and_flag(device, dtype):
    from patchkit.patches.modelopt.qat._nvfp4_pack import quantize_nvfp4_group

    weights, amaxes = _group_case(device)
    weights = [w.to(dtype) for w in weights]
    results, flags = quantize_nvfp4_group(weights, amaxes)
    assert flags.tolist() == [False, False, False, False, True, False, True, False]
    for index, (weight, amax, (packed, scale, scale_2)) in enumerate(zip(weights, amaxes, results, strict=True)):
        expected = quantize_nvfp4(weight, amax.to(device), backend="torch")  # the export's amax is on the device
        if index == 4:
            continue  # NaN blocks differ between the paths (the export refuses them); the flag says so
        assert torch.equal(packed, expected[0]), f"weight {index}: {(packed != expected[0]).sum()} bytes differ"
        assert torch.equal(scale.view(torch.uint8), expected[1].view(torch.uint8)), f"weight {index}: scales differ"
        assert torch.equal(scale_2, expected[2].to(scale_2.device)), f"weight {index}: weight_scale_2 differs"
        assert packed.data_ptr() != results[index - 1][0].data_ptr() or not packed.numel()  # own allocations


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda]),
])
def test_the_grouped_stream_yields_what_one_weight_at_a_time_yields(device, monkeypatch):
    from patchkit.patches.modelopt.qat import _export_tensors
    from patchkit.patches.modelopt.qat._export_finite import NonFiniteWeights
    from patchkit.patches.modelopt.qat._export_tensors import QuantSpec, checkpoint_stream, checkpoint_tensors

    monkeypatch.setattr(_export_tensors, "GROUPED_WEIGHT_LIMIT", 1 << 19)  # the 1 MiB weight goes alone

    generator = torch.Generator().manual_seed(6)
    items = []
    for index in range(40):  # small experts, then a large weight that closes a group, a plain tensor between
        shape = (8192, 64) if index == 20 else (32 * (1 + index % 3), 128)
        weight = torch.randn(shape, generator=generator).to(torch.bfloat16).to(device)
        spec = None if index == 30 else QuantSpec(16, weight.float().abs().amax().cpu(),
                                                  torch.tensor(3.0) if index == 7 else None)
        items.append((f"layers.{index}.weight", weight, spec, index % 2 == 0))
    one_at_a_time = [pair for name, weight, spec, _ in items
                     for pair in checkpoint_tensors(name, weight, spec, NonFiniteWeights())]
    grouped = list(checkpoint_stream(iter(items), NonFiniteWeights()))
    assert [name for name, _ in grouped] == [name for name, _ in one_at_a_time]
    for (name, got), (_, expected) in zip(grouped, one_at_a_time, strict=True):
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                           expected.view(torch.uint8) if expected.dtype == torch.float8_e4m3fn else expected), name


def test_nonfinite_flags_recorded_one_by_one_and_by_group_name_the_first_bad_weight():
    from patchkit.patches.modelopt._errors import QATExportError
    from patchkit.patches.modelopt.qat._export_finite import NonFiniteWeights

    flags = NonFiniteWeights()
    flags.record("a.weight", torch.tensor(False))
    flags.record_group(["b.weight", "c.weight", "d.weight"], torch.tensor([False, True, True]))
    flags.record("e.weight", torch.tensor(True))
    with pytest.raises(QATExportError, match="2 more weights") as raised:
        flags.raise_if_any()
    assert "c.weight" in str(raised.value)
    flags.record_group(["f.weight"], torch.tensor([False]))
    flags.raise_if_any()
