"""NVFP4 quantize-and-pack of a CUDA weight in one Triton kernel: the same bits as ``_nvfp4_pack``.

The torch path of ``_nvfp4_pack.quantize_nvfp4`` is about twenty elementwise passes over float32
temporaries; on a GPU that runs at under 1% of a plain copy's throughput. Here one program reads
``BLOCKS`` blocks of 16 weights once and writes their packed codes and FP8 scales: 2 bytes read and
0.56 bytes written per bf16 weight, against a copy's 2 and 2. The kernel is bound by arithmetic,
not memory, so the E2M1 code takes three integer roundings rather than seven comparisons.

Bit-identity with ModelOpt's export arithmetic (the torch path, ``tests/export``) rests on:

- divisions rounded to nearest (``div_rn``): Triton's ``/`` on float32 is the approximate
  ``div.full.f32``, which can put a value on the other side of an E2M1 rounding boundary (measured:
  it would be 1.5x faster, and wrong);
- the FP8 block scale is a round-to-nearest-even cast of a value already clamped to ``[2**-9, 448]``,
  as torch's ``.to(torch.float8_e4m3fn)``;
- ModelOpt's E2M1 rounding (ties at 0.25, 1.25, 2.5, 5 go down, at 0.75, 1.75, 3.5 up) is
  round-half-to-even on the code: the grid steps by 0.5 below 2, by 1 below 4 and by 2 up to 6, so
  the code is ``rint(2m)``, ``rint(m) + 2`` or ``rint(m / 2) + 4`` (scaling by 2 is exact), and 7 above
  6, for infinity and for NaN.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

#: Blocks of 16 weights per program and warps per program (fastest on an H200, bf16 4096 x 57344).
BLOCKS_PER_PROGRAM = 128
WARPS = 4


@triton.jit
def _e2m1_codes(scaled):
    magnitude = tl.abs(scaled)
    code = tl.where(magnitude < 2.0, libdevice.float2int_rn(magnitude * 2.0),
                    tl.where(magnitude < 4.0, libdevice.float2int_rn(magnitude) + 2,
                             tl.where(magnitude <= 6.0, libdevice.float2int_rn(magnitude * 0.5) + 4, 7)))
    return (code | ((scaled < 0).to(tl.int32) << 3)).to(tl.uint8)


@triton.jit
def _max_keeping_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _quantize_blocks(weight_ptr, packed_ptr, scale_ptr, scale_2_ptr, bad_ptr, n_blocks, BLOCKS: tl.constexpr):
    block = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    in_range = block < n_blocks
    # Even and odd elements of each block as two [BLOCKS, 8] tiles: they share cache lines, and
    # the packed byte is even | odd << 4 with no reshuffling between threads.
    even_offsets = block[:, None] * 16 + tl.arange(0, 8)[None, :] * 2
    even = tl.load(weight_ptr + even_offsets, mask=in_range[:, None], other=0.0).to(tl.float32)
    odd = tl.load(weight_ptr + even_offsets + 1, mask=in_range[:, None], other=0.0).to(tl.float32)
    scale_2 = tl.load(scale_2_ptr)

    # NaN survives the block maximum (as in torch's amax; tl.max would drop it), so a block holding
    # NaN or infinity has a non-finite amax: the flag costs no extra pass over the weights.
    block_amax = _max_keeping_nan(tl.reduce(tl.abs(even), 1, _max_keeping_nan),
                                  tl.reduce(tl.abs(odd), 1, _max_keeping_nan))
    block_scale = tl.math.div_rn(block_amax, 6.0 * scale_2)
    block_scale = tl.where(block_scale == 0.0, 1.0, block_scale)
    block_scale = tl.minimum(tl.maximum(block_scale, 0.001953125), 448.0)  # [2**-9, 448]
    block_scale_fp8 = block_scale.to(tl.float8e4nv, fp_downcast_rounding="rtne")

    divisor = (block_scale_fp8.to(tl.float32) * scale_2)[:, None]
    packed = _e2m1_codes(tl.math.div_rn(even, divisor)) | (_e2m1_codes(tl.math.div_rn(odd, divisor)) << 4)
    tl.store(packed_ptr + block[:, None] * 8 + tl.arange(0, 8)[None, :], packed, mask=in_range[:, None])
    tl.store(scale_ptr + block, block_scale_fp8, mask=in_range)
    non_finite = ((block_amax != block_amax) | (block_amax == float("inf"))).to(tl.int8)  # masked blocks: 0
    tl.store(bad_ptr + tl.program_id(0), tl.max(non_finite, axis=0))


def quantize_rows(rows: torch.Tensor, scale_2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed uint8 [rows, columns / 2], scales fp8 [rows, columns / 16], bad int8 [programs])`` of a 2-D
    CUDA weight.

    Blocks of 16 along the last dimension; ``columns`` must be a multiple of 16 (checked by the
    caller). ``bad`` is 1 for each program whose blocks hold a NaN or an infinity. No float32
    temporaries: the outputs are the only allocation.
    """
    rows = rows.contiguous()
    packed = torch.empty(rows.shape[0], rows.shape[1] // 2, dtype=torch.uint8, device=rows.device)
    scales = torch.empty(rows.shape[0], rows.shape[1] // 16, dtype=torch.float8_e4m3fn, device=rows.device)
    n_blocks = rows.numel() // 16
    programs = triton.cdiv(n_blocks, BLOCKS_PER_PROGRAM)
    bad = torch.empty(programs, dtype=torch.int8, device=rows.device)
    if n_blocks:
        _quantize_blocks[(programs,)](rows, packed, scales, scale_2.reshape(1).to(torch.float32).contiguous(), bad,
                                      n_blocks, BLOCKS=BLOCKS_PER_PROGRAM, num_warps=WARPS)
    return packed, scales, bad
