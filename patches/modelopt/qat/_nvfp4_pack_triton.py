"""NVFP4 quantize-and-pack of a CUDA weight in one Triton kernel: the same bits as ``_nvfp4_pack``.

The torch path of ``_nvfp4_pack.quantize_nvfp4`` is about twenty elementwise passes over float32
temporaries; on a GPU that runs at under 1% of a plain copy's throughput. Here one program reads
``BLOCKS`` blocks of 16 weights once, in 16-byte vectors, and writes their packed codes and FP8
scales: 2 bytes read and 0.5625 written per bf16 weight, against a copy's 2 and 2. The per-tensor
amax is not computed here: it is the quantizer's calibrated ``_amax``, which ModelOpt's own export
uses too, so the export is one pass over the weights.

At that traffic the kernel is bound by instruction issue, not memory, so each weight costs as few
instructions as possible and no division:

- **codes by threshold**: ModelOpt's code of a weight ``x`` is a function of the correctly rounded
  quotient ``q = RN(x / d)`` (``d = block_scale * scale_2``): E2M1 rounding with ties at 0.25, 1.25,
  2.5, 5 going down and at 0.75, 1.75, 3.5 going up. It grows with ``|x|``, so the code is the
  number of the block's seven thresholds ``|x|`` reaches, the smallest ``|x|`` whose quotient passes
  each boundary. Those are exact per block: a boundary ``b`` is passed when ``|x| / d`` exceeds
  ``b + ulp(b) / 2`` (ties down; the tie rounds to ``b``, whose mantissa is even) or reaches
  ``b - ulp(b) / 2`` (ties up), and ``d * (b +- ulp(b) / 2)`` is one fused multiply-add rounded
  down or up (``fma.rm`` / ``fma.rp``) since ``d * ulp(b) / 2`` is exact. The sign bit is set when
  the quotient is not -0.0: ``|x| / d > 2**-150``, the subnormal ``floor(d / 2) + 1`` for ``d < 2**24``.
  A program with a divisor outside ``[2**-90, 2**24)`` (a tiny or huge amax) divides instead
  (``div_rn``: Triton's ``/`` is the approximate ``div.full.f32``), with the code ``rint(2m)``,
  ``rint(m) + 2`` or ``rint(m / 2) + 4`` of the quotient's magnitude ``m`` (scaling by 2 is exact)
  and 7 above 6, for infinity and for NaN;
- the FP8 block scale is a round-to-nearest-even cast of a value already clamped to ``[2**-9, 448]``,
  as torch's ``.to(torch.float8_e4m3fn)``;
- floating-point contraction is off (``enable_fp_fusion=False``): the fused multiply-adds above are
  written out, and no other product may be fused into a sum torch rounds twice.

Small weights (MoE experts) cost more host time than device time when each is its own call and
launch, so :func:`quantize_group` quantizes several in one launch: a table of addresses and block
counts travels to the device in one (pinned) copy, each program looks its weight up there, and the
per-tensor scale is computed in the kernel from the weight's amax exactly as torch computes it on
the device.
"""

from __future__ import annotations

import struct
from typing import Sequence

import torch
import triton
import triton.language as tl

#: Blocks of 16 weights per program and warps per program (fastest measured on an H200).
BLOCKS_PER_PROGRAM = 256
WARPS = 4
#: Codes by bisection over the thresholds (three comparisons a weight) rather than by counting (seven).
BISECT = False
#: Columns of a group launch's table: weight, packed, scale and weight_scale_2 addresses, block count.
_TABLE_COLUMNS = tl.constexpr(5)
#: 1 / 2688 rounded to float32, as torch's CUDA division by a host scalar takes it.
_RECIPROCAL_2688 = tl.constexpr(struct.unpack("f", struct.pack("f", 1.0 / 2688.0))[0])

_TWO_POW_23 = tl.constexpr(8388608.0)  # float32 bits of 2**23 + n (0 <= n < 2**22) are 0x4B000000 + n
#: Divisors for which the thresholds below are exact (no product underflows, the sign threshold is subnormal).
_DIVISOR_LOW = tl.constexpr(2.0**-90)
_DIVISOR_HIGH = tl.constexpr(2.0**24)


@triton.jit
def _fma_down(a, b, c):
    return tl.inline_asm_elementwise("fma.rm.f32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _fma_up(a, b, c):
    return tl.inline_asm_elementwise("fma.rp.f32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _above(product_down):
    """The smallest float32 above a positive finite float32."""
    return (product_down.to(tl.int32, bitcast=True) + 1).to(tl.float32, bitcast=True)


@triton.jit
def _threshold_ties_down(divisor, boundary, half_ulp):
    """Smallest |x| whose rounded quotient lies above ``boundary`` (whose tie rounds down to it, the even one):
    |x| / divisor > boundary + half_ulp, so the float32 just above the product rounded down."""
    return _above(_fma_down(divisor, boundary, divisor * half_ulp))


@triton.jit
def _threshold_ties_up(divisor, boundary, half_ulp):
    """Smallest |x| whose rounded quotient reaches ``boundary`` (whose tie rounds up to it, the even one):
    |x| / divisor >= boundary - half_ulp, so the product rounded up."""
    return _fma_up(divisor, boundary, -(divisor * half_ulp))


@triton.jit
def _exact_codes(quotient):
    """E2M1 codes (int32, sign in bit 3) of correctly rounded quotients: rint of the value on its grid."""
    magnitude = tl.abs(quotient)
    below_2 = magnitude < 2.0
    below_4 = magnitude < 4.0
    step = tl.where(below_2, 2.0, tl.where(below_4, 1.0, 0.5))
    offset = tl.where(below_2, 0, tl.where(below_4, 2, 4))
    shifted = tl.fma(magnitude, step, _TWO_POW_23)  # magnitude * step is exact; the sum rounds it to an integer
    code = tl.where(magnitude <= 6.0, shifted.to(tl.int32, bitcast=True) - 0x4B000000 + offset, 7)  # NaN: 7
    return code | ((quotient < 0).to(tl.int32) << 3)


@triton.jit
def _below(bits, threshold):
    """-1 where the non-negative float32 of ``bits`` is below ``threshold``, else 0 (their bits order alike)."""
    return (bits - threshold.to(tl.int32, bitcast=True)) >> 31


@triton.jit
def _codes_by_threshold(weights, t0, t1, t2, t3, t4, t5, t6, t7):
    """E2M1 codes of ``weights / divisor`` from the divisor's thresholds (``[BLOCKS, 1]``): 7 less one for
    each threshold |x| stays below, counted on the integer bits (NaN, above every threshold, gets 7 as
    the quotient's code does). Integer subtractions and shifts rather than float compares and selects:
    they share the load between the integer and the floating-point units."""
    bits = tl.abs(weights).to(tl.int32, bitcast=True)
    code = 7 + _below(bits, t1) + _below(bits, t2) + _below(bits, t3) + _below(bits, t4) + _below(bits, t5) \
        + _below(bits, t6) + _below(bits, t7)
    negative = (weights < 0.0) & ~(tl.abs(weights) < t0)  # a quotient that rounds to -0.0 has no sign bit
    return code | (negative.to(tl.int32) << 3)


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _packed(codes, BLOCKS: tl.constexpr):
    """``[BLOCKS, 8]`` codes to ``[BLOCKS, 4]`` bytes, the even element in the low nibble."""
    even, odd = tl.split(tl.reshape(codes, (BLOCKS, 4, 2)))
    return (even | (odd << 4)).to(tl.uint8)


@triton.jit
def _codes_by_bisection(weights, t0, t1, t2, t3, t4, t5, t6, t7):
    """The same codes as ``_codes_by_threshold`` in three comparisons: the thresholds ascend, so the
    count of those |x| reaches is found by bisection (t4, then t2 or t6, then the odd one between)."""
    bits = tl.abs(weights).to(tl.int32, bitcast=True)
    high = bits >= t4.to(tl.int32, bitcast=True)
    middle = bits >= tl.where(high, t6, t2).to(tl.int32, bitcast=True)
    last = tl.where(high, tl.where(middle, t7, t5), tl.where(middle, t3, t1))
    low = bits >= last.to(tl.int32, bitcast=True)
    code = (high.to(tl.int32) << 2) | (middle.to(tl.int32) << 1) | low.to(tl.int32)
    negative = (weights < 0.0) & ~(tl.abs(weights) < t0)  # a quotient that rounds to -0.0 has no sign bit
    return code | (negative.to(tl.int32) << 3)


@triton.jit
def _quantize_tile(weight_ptr, packed_ptr, scale_ptr, scale_2, program, n_blocks, BLOCKS: tl.constexpr,
                   BISECT: tl.constexpr):
    """Quantize and pack blocks ``[program * BLOCKS, program * BLOCKS + BLOCKS)`` of one weight; returns the
    program's flags (bit 0: it divided, bit 1: a block holds NaN or infinity)."""
    block = program.to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = block < n_blocks
    # Two [BLOCKS, 8] halves (16-byte loads) rather than one [BLOCKS, 16] tile: each thread holds
    # whole blocks, so the block maximum and the packing need no exchange between threads.
    first = block[:, None] * 16 + tl.arange(0, 8)[None, :]
    low = tl.load(weight_ptr + first, mask=in_range[:, None], other=0.0).to(tl.float32)
    high = tl.load(weight_ptr + first + 8, mask=in_range[:, None], other=0.0).to(tl.float32)

    # NaN survives the block maximum (as in torch's amax; tl.max would drop it), so a block holding
    # NaN or infinity has a non-finite amax: the flag costs no extra pass over the weights.
    block_amax = _max_keeping_nan(tl.reduce(tl.abs(low), 1, _max_keeping_nan),
                                  tl.reduce(tl.abs(high), 1, _max_keeping_nan))
    block_scale = tl.math.div_rn(block_amax, 6.0 * scale_2)
    block_scale = tl.where(block_scale == 0.0, 1.0, block_scale)
    block_scale = tl.minimum(tl.maximum(block_scale, 0.001953125), 448.0)  # [2**-9, 448]
    block_scale_fp8 = block_scale.to(tl.float8e4nv, fp_downcast_rounding="rtne")
    divisor = block_scale_fp8.to(tl.float32) * scale_2

    # The code of x is how many of the block's thresholds |x| reaches: the smallest |x| whose
    # correctly rounded quotient passes each E2M1 rounding boundary (0.25, 1.25, 2.5 and 5 tie
    # down; 0.75, 1.75 and 3.5 tie up; ulp / 2 beside each), and the smallest whose quotient is not
    # 0 (2**-150 ties down to 0: for divisors below 2**24 that is the subnormal floor(divisor / 2) + 1).
    t0 = (tl.floor(divisor * 0.5).to(tl.int32) + 1).to(tl.float32, bitcast=True)[:, None]
    t1 = _threshold_ties_down(divisor, 0.25, 2.0**-26)[:, None]
    t2 = _threshold_ties_up(divisor, 0.75, 2.0**-25)[:, None]
    t3 = _threshold_ties_down(divisor, 1.25, 2.0**-24)[:, None]
    t4 = _threshold_ties_up(divisor, 1.75, 2.0**-24)[:, None]
    t5 = _threshold_ties_down(divisor, 2.5, 2.0**-23)[:, None]
    t6 = _threshold_ties_up(divisor, 3.5, 2.0**-23)[:, None]
    t7 = _threshold_ties_down(divisor, 5.0, 2.0**-22)[:, None]
    if BISECT:
        low_codes = _codes_by_bisection(low, t0, t1, t2, t3, t4, t5, t6, t7)
        high_codes = _codes_by_bisection(high, t0, t1, t2, t3, t4, t5, t6, t7)
    else:
        low_codes = _codes_by_threshold(low, t0, t1, t2, t3, t4, t5, t6, t7)
        high_codes = _codes_by_threshold(high, t0, t1, t2, t3, t4, t5, t6, t7)
    # Divisors outside [2**-90, 2**24) (a tiny or huge amax, NaN): the program divides instead. One
    # reduction over the program gives that and the NaN/infinity flag (bit 1).
    extreme = (~(divisor >= _DIVISOR_LOW) | ~(divisor < _DIVISOR_HIGH)).to(tl.int32)
    non_finite = ((block_amax != block_amax) | (block_amax == float("inf"))).to(tl.int32)  # masked blocks: 0
    program_flags = tl.max(extreme | (non_finite << 1), axis=0)
    if (program_flags & 1) != 0:
        low_codes = _exact_codes(tl.math.div_rn(low, divisor[:, None]))
        high_codes = _exact_codes(tl.math.div_rn(high, divisor[:, None]))

    out = block[:, None] * 8 + tl.arange(0, 4)[None, :]
    tl.store(packed_ptr + out, _packed(low_codes, BLOCKS), mask=in_range[:, None])
    tl.store(packed_ptr + out + 4, _packed(high_codes, BLOCKS), mask=in_range[:, None])
    tl.store(scale_ptr + block, block_scale_fp8, mask=in_range)
    return program_flags


@triton.jit
def _quantize_blocks(weight_ptr, packed_ptr, scale_ptr, scale_2_ptr, bad_ptr, n_blocks, BLOCKS: tl.constexpr,
                     BISECT: tl.constexpr):
    flags = _quantize_tile(weight_ptr, packed_ptr, scale_ptr, tl.load(scale_2_ptr), tl.program_id(0), n_blocks,
                           BLOCKS, BISECT)
    tl.store(bad_ptr + tl.program_id(0), (flags >> 1).to(tl.int8))


@triton.jit
def _quantize_group(table_ptr, amax_ptr, bad_ptr, weight_type_ptr, BLOCKS: tl.constexpr, BISECT: tl.constexpr,
                    ALIGNED: tl.constexpr):
    """One launch over several weights: grid ``(programs of the largest, weights)``. Row ``w`` of the
    table holds weight ``w``'s address, its packed, scale and ``weight_scale_2`` outputs' addresses and its
    block count; ``amax_ptr[w]`` is its per-tensor amax. Programs past a weight's last block do nothing.
    ``ALIGNED``: every weight starts on 16 bytes (the host checked), so the loads can be 16 bytes wide
    (Triton knows nothing of an address read from memory)."""
    weight = tl.program_id(1)
    row = table_ptr + weight * _TABLE_COLUMNS
    n_blocks = tl.load(row + 4)
    program = tl.program_id(0)
    # weight_scale_2 = amax / (6 * 448) as torch computes it on the device: a float32 division by a
    # host scalar is a product with the scalar's rounded reciprocal there.
    scale_2 = tl.load(amax_ptr + weight) * _RECIPROCAL_2688
    if program == 0:
        tl.store(tl.load(row + 3).to(tl.pointer_type(tl.float32)), scale_2)
    if program.to(tl.int64) * BLOCKS < n_blocks:
        weight_ptr = tl.load(row).to(tl.pointer_type(weight_type_ptr.dtype.element_ty))
        packed_ptr = tl.load(row + 1).to(tl.pointer_type(tl.uint8))
        scale_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float8e4nv))
        if ALIGNED:
            weight_ptr = tl.multiple_of(weight_ptr, 16)
            packed_ptr = tl.multiple_of(packed_ptr, 16)
            scale_ptr = tl.multiple_of(scale_ptr, 16)
        flags = _quantize_tile(weight_ptr, packed_ptr, scale_ptr, scale_2, program, n_blocks, BLOCKS, BISECT)
        if (flags >> 1) != 0:
            tl.store(bad_ptr + weight, 1)


def quantize_rows(rows: torch.Tensor, scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed uint8 [rows, columns / 2], scales fp8 [rows, columns / 16], bad int8 [programs])`` of a 2-D
    CUDA weight.

    Blocks of 16 along the last dimension; ``columns`` must be a multiple of 16 (checked by the
    caller). ``scale_2`` is the float32 per-tensor scale on the weight's device. ``bad`` is 1 for
    each program whose blocks hold a NaN or an infinity. No float32 temporaries: the outputs are
    the only allocation.
    """
    rows = rows.contiguous()
    packed = torch.empty(rows.shape[0], rows.shape[1] // 2, dtype=torch.uint8, device=rows.device)
    scales = torch.empty(rows.shape[0], rows.shape[1] // 16, dtype=torch.float8_e4m3fn, device=rows.device)
    n_blocks = rows.numel() // 16
    programs = triton.cdiv(n_blocks, BLOCKS_PER_PROGRAM)
    bad = torch.empty(programs, dtype=torch.int8, device=rows.device)
    if scale_2.dtype != torch.float32:
        scale_2 = scale_2.float()
    if n_blocks:
        _quantize_blocks[(programs,)](rows, packed, scales, scale_2, bad, n_blocks, BLOCKS=BLOCKS_PER_PROGRAM,
                                      BISECT=BISECT, num_warps=WARPS, enable_fp_fusion=False)
    return packed, scales, bad


#: A grid's second dimension is at most 65,535: longer groups are launched in parts.
_MAX_GROUP = 65535


def quantize_group(
    weights: Sequence[torch.Tensor], amaxes: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Quantize several 2-D CUDA weights of one dtype and device in one launch.

    ``amaxes``: float32 ``[len(weights)]`` on the weights' device, each weight's calibrated amax.
    Returns ``(packed, scales, weight_scale_2, bad)``: per weight the same tensors as
    :func:`quantize_rows` and ``_nvfp4_pack.weight_scale_2`` of the amax on the device give (each its
    own allocation, so a consumer may keep, free or save any of them alone), and ``bad`` int8
    ``[len(weights)]``, 1 for a
    weight holding a NaN or an infinity. The host does no per-weight device work: the table of
    addresses travels in one copy, and nothing waits for the device.
    """
    device = weights[0].device
    packed = [torch.empty(w.shape[0], w.shape[1] // 2, dtype=torch.uint8, device=device) for w in weights]
    scales = [torch.empty(w.shape[0], w.shape[1] // 16, dtype=torch.float8_e4m3fn, device=device) for w in weights]
    scale_2 = [torch.empty((), dtype=torch.float32, device=device) for _ in weights]
    bad = torch.zeros(len(weights), dtype=torch.int8, device=device)
    blocks = [w.numel() // 16 for w in weights]
    rows = [(w.data_ptr(), p.data_ptr(), s.data_ptr(), s2.data_ptr(), n)
            for w, p, s, s2, n in zip(weights, packed, scales, scale_2, blocks, strict=True)]
    aligned = all(row[0] % 16 == 0 for row in rows)  # outputs are fresh allocations: always aligned
    # Pinned: a copy from pageable memory would make the host wait for the device's earlier work.
    table = torch.tensor(rows, dtype=torch.int64, pin_memory=True).to(device, non_blocking=True)
    for start in range(0, len(weights), _MAX_GROUP):
        part = slice(start, start + _MAX_GROUP)
        grid = (max(1, triton.cdiv(max(blocks[part]), BLOCKS_PER_PROGRAM)), len(blocks[part]))
        _quantize_group[grid](table[part], amaxes[part], bad[part], weights[0], BLOCKS=BLOCKS_PER_PROGRAM,
                              BISECT=BISECT, ALIGNED=aligned, num_warps=WARPS, enable_fp_fusion=False)
    return packed, scales, scale_2, bad
