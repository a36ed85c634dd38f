"""NVFP4 checkpoint tensors from a high-precision weight: ModelOpt's export arithmetic, in bounded memory.

The format (ModelOpt ``NVFP4QTensor``, read by vLLM's ModelOpt NVFP4 loaders):

- ``weight_scale_2`` (float32): ``amax / (6 * 448)``, the quantizer's calibrated amax;
- ``weight_scale`` (FP8 E4M3, one per block of ``block_size`` along the last dimension):
  ``block_amax / (6 * weight_scale_2)``, 0 replaced by 1, clamped to ``[2**-9, 448]``;
- ``weight`` (uint8): each value divided by ``weight_scale * weight_scale_2`` and rounded to an
  E2M1 code (sign bit 3, magnitude index 0..7; ties at 0.25/1.25/2.5/5 go down, at 0.75/1.75/3.5
  up), two codes per byte with the **even** element in the low nibble.

Each step is written as ModelOpt 0.47 writes it (``qtensor/nvfp4_tensor.py``:
``get_weights_scaling_factor``, ``_cast_per_block_scale_to_fp8``, ``quantize``, ``_cast_fp4``), so
the result is bit-identical (``tests/export/test_export_bitexact.py``). What differs is memory:
rows are processed in slices so the float32 temporaries never exceed ``slice_bytes``, where
ModelOpt materialises several float32 copies of the whole weight. On a CUDA weight, with Triton
installed, one fused kernel (``_nvfp4_pack_triton``) computes the same bits without temporaries;
:func:`quantize_nvfp4_group` runs it over several weights in one launch.
"""

from __future__ import annotations

import importlib.util
from typing import Literal, Sequence

import torch

E2M1_MAX = 6.0
E4M3_MAX = 448.0
E4M3_MIN_SCALE = 2.0**-9
#: Default upper bound on the float32 temporaries of one slice (bytes).
DEFAULT_SLICE_BYTES = 64 << 20
_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def weight_scale_2(amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale, ``amax / (6 * 448)`` in float32, as ModelOpt derives it from ``_amax``."""
    return amax.float() / (E2M1_MAX * E4M3_MAX)


def _codes(scaled: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, sign in bit 3) of already-scaled float32 values; ModelOpt's ``_cast_fp4`` rules."""
    magnitude = scaled.abs()
    # bucketize (left) counts the boundaries strictly below |x|, so ties go down, as ModelOpt's
    # searchsorted does; at the three odd boundaries ModelOpt rounds up instead.
    code = torch.bucketize(magnitude, _bounds(magnitude.device), out_int32=True).to(torch.uint8)
    code += ((magnitude == 0.75) | (magnitude == 1.75) | (magnitude == 3.5)).to(torch.uint8)
    code |= (scaled < 0).to(torch.uint8) << 3
    return code


_BOUNDS: dict[torch.device, torch.Tensor] = {}


def _bounds(device: torch.device) -> torch.Tensor:
    """Decision boundaries between the E2M1 magnitudes, one tensor per device."""
    if device not in _BOUNDS:
        _BOUNDS[device] = torch.tensor((0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0), dtype=torch.float32, device=device)
    return _BOUNDS[device]


def _quantize_rows(
    rows: torch.Tensor, scale_2: torch.Tensor, block_size: int, finite: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = rows.reshape(rows.shape[0], -1, block_size)
    block_amax = blocks.abs().amax(dim=-1).float()
    finite.append(torch.isfinite(block_amax).all())  # amax propagates NaN and infinity
    block_scale = block_amax / (E2M1_MAX * scale_2)
    block_scale[block_scale == 0] = 1.0
    block_scale_fp8 = block_scale.clamp(min=E4M3_MIN_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)
    # ModelOpt divides the weight (any dtype) by a float32 product, which promotes to float32.
    scaled = blocks / (block_scale_fp8.to(torch.float32) * scale_2).unsqueeze(-1)
    code = _codes(scaled).reshape(rows.shape[0], -1)
    packed = (code[:, 1::2] << 4) | code[:, 0::2]
    return packed, block_scale_fp8


def quantize_nvfp4(
    weight: torch.Tensor,
    amax: torch.Tensor,
    block_size: int = 16,
    *,
    slice_bytes: int = DEFAULT_SLICE_BYTES,
    backend: Literal["auto", "torch", "triton"] = "auto",
    nonfinite: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed weight uint8, weight_scale fp8, weight_scale_2 fp32)`` of ``weight`` with its quantizer's amax.

    ``weight`` has the blocks along its last dimension, which must be a multiple of ``block_size``
    (ModelOpt pads otherwise; Megatron linears never need it). Leading dimensions are kept.
    ``backend="auto"`` runs the fused Triton kernel for a CUDA weight with blocks of 16 when Triton
    is installed, and the torch ops otherwise; both give the same bits.

    ``nonfinite``: a list to which a 0-d bool tensor on the weight's device is appended, True when
    the weight holds a NaN or an infinity (which NVFP4 would turn into the largest code without a
    word). It comes from the quantization pass itself and is not read here, so checking it costs
    no wait on the device; the caller reads it when it chooses (``._export``: at the end of the
    stream).
    """
    if weight.dim() < 1 or weight.shape[-1] % block_size or weight.shape[-1] % 2:
        raise ValueError(
            f"NVFP4 export needs the last dimension to be a multiple of the block size {block_size}; "
            f"got a weight of shape {tuple(weight.shape)}"
        )
    scale_2 = weight_scale_2(amax.detach()).to(weight.device)
    columns = weight.shape[-1]
    rows = weight.detach().reshape(-1, columns)
    leading = tuple(weight.shape[:-1])
    if _use_triton(weight, block_size, backend):
        from ._nvfp4_pack_triton import quantize_rows

        packed, scales, bad_programs = quantize_rows(rows, scale_2)
        if nonfinite is not None:
            nonfinite.append(bad_programs.any())
        return packed.reshape(*leading, columns // 2), scales.reshape(*leading, columns // block_size), scale_2
    packed = torch.empty(rows.shape[0], columns // 2, dtype=torch.uint8, device=weight.device)
    scales = torch.empty(rows.shape[0], columns // block_size, dtype=torch.float8_e4m3fn, device=weight.device)
    # About 16 bytes of temporaries per element of a slice are alive at once (float32 scaled and
    # |scaled|, the codes); slices of at most half the weight's own size keep the peak extra memory
    # (outputs 0.28x + temporaries) under the weight's size.
    budget = min(slice_bytes, max(weight.numel() * weight.element_size() // 2, 16 * columns))
    step = max(1, budget // (16 * columns))
    finite = [torch.ones((), dtype=torch.bool, device=weight.device)]  # a weight with no rows is finite
    for start in range(0, rows.shape[0], step):
        part = slice(start, start + step)
        packed[part], scales[part] = _quantize_rows(rows[part], scale_2, block_size, finite)
    if nonfinite is not None:
        nonfinite.append(~torch.stack(finite).all())
    return packed.reshape(*leading, columns // 2), scales.reshape(*leading, columns // block_size), scale_2


def quantize_nvfp4_group(
    weights: Sequence[torch.Tensor],
    amaxes: Sequence[torch.Tensor],
    block_size: int = 16,
    *,
    backend: Literal["auto", "torch", "triton"] = "auto",
) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor]:
    """:func:`quantize_nvfp4` of several weights at once, each amax moved to its weight's device first (as
    the export does: ``weight_scale_2`` is then torch's division on that device): per weight the same
    three tensors, bit for bit, and a bool tensor ``[len(weights)]`` on their device, True for each
    weight holding a NaN or an infinity (not read here: no wait on the device).

    CUDA weights of one device and dtype with blocks of 16 (Triton installed, ``backend`` not
    ``"torch"``) go through one kernel launch for the whole group, with no per-weight device work
    on the host: small weights (experts) then cost a few microseconds of host time each, not a
    launch and a handful of torch calls. Anything else is quantized one weight at a time.
    """
    if not weights:
        return [], torch.zeros(0, dtype=torch.bool)
    for weight in weights:
        if weight.dim() < 1 or weight.shape[-1] % block_size or weight.shape[-1] % 2:
            quantize_nvfp4(weight, amaxes[0], block_size)  # raises the shape error, naming the shape
    device, dtype = weights[0].device, weights[0].dtype
    grouped = all(w.device == device and w.dtype == dtype for w in weights) and all(
        _use_triton(w, block_size, backend) for w in weights)
    if not grouped:
        results: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        flags: list[torch.Tensor] = []
        for weight, amax in zip(weights, amaxes, strict=True):
            results.append(quantize_nvfp4(weight, amax.to(weight.device), block_size, backend=backend,
                                          nonfinite=flags))
        return results, torch.stack(flags)
    from ._nvfp4_pack_triton import quantize_group

    rows = [w.detach() if w.dim() == 2 and w.is_contiguous() else w.detach().reshape(-1, w.shape[-1]).contiguous()
            for w in weights]
    amax_devices = {a.device for a in amaxes}
    if amax_devices == {torch.device("cpu")}:
        # Pinned: a copy from pageable memory would make the host wait for the device's earlier work.
        pinned = torch.empty(len(amaxes), dtype=torch.float32, pin_memory=True)
        torch.stack([a.detach().reshape(()).float() for a in amaxes], out=pinned)
        stacked = pinned.to(device, non_blocking=True)
    else:
        stacked = torch.stack([a.detach().reshape(()).float().to(device) for a in amaxes])
    packed, scales, scale_2, bad = quantize_group(rows, stacked)
    results = []
    for weight, amax, p, s, s2 in zip(weights, amaxes, packed, scales, scale_2, strict=True):
        if weight.dim() != 2:
            leading = tuple(weight.shape[:-1])
            p, s = p.reshape(*leading, p.shape[-1]), s.reshape(*leading, s.shape[-1])
        results.append((p, s, s2 if amax.dim() == 0 else s2.reshape(amax.shape)))
    return results, bad != 0


def _use_triton(weight: torch.Tensor, block_size: int, backend: str) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if backend == "torch":
        return False
    usable = weight.is_cuda and block_size == 16 and importlib.util.find_spec("triton") is not None
    if backend == "triton" and not usable:
        raise ValueError(f"the Triton NVFP4 pack needs a CUDA weight, blocks of 16 and Triton installed; got a "
                         f"{weight.device.type} weight, blocks of {block_size}")
    return usable


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """E2M1 values (float32) of a packed uint8 tensor, even elements from the low nibble."""
    values = torch.tensor(_E2M1_VALUES, dtype=torch.float32, device=packed.device)
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1)
    magnitude = values[(codes & 0x07).long()]
    return torch.where((codes & 0x08) != 0, -magnitude, magnitude)


def dequantize_nvfp4(
    packed: torch.Tensor, weight_scale: torch.Tensor, scale_2: torch.Tensor, block_size: int = 16
) -> torch.Tensor:
    """``E2M1 value * weight_scale * weight_scale_2`` in float32: what a checkpoint reader computes."""
    values = unpack_e2m1(packed)
    blocks = values.reshape(*values.shape[:-1], -1, block_size)
    block_scale = weight_scale.float() * scale_2.float()
    return (blocks * block_scale.unsqueeze(-1)).reshape(values.shape)
