"""What NVFP4 output must look like, judged without patchkit's own arithmetic.

Shared by the ModelOpt self-check (``patchkit doctor``) and ``tests/modelopt`` (through
``qat_fixtures``), so the check and the tests judge the grid the same way.
"""

from __future__ import annotations

import torch

from patchkit.selfcheck import SelfCheckFailed

#: FP4 E2M1 magnitudes.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: E2M1 decision boundaries. Values that scale exactly onto one are rounding ties.
E2M1_BOUNDARIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def assert_blocks_on_fp4_grid(weight: torch.Tensor, quantized: torch.Tensor, block_size: int = 16) -> int:
    """Each block of ``quantized`` holds at most 8 magnitudes, all E2M1 values times one block scale.

    The scale is not taken from patchkit: a block's largest magnitude must be some E2M1 value ``m``
    times the scale, so some ``scale = max / m`` must put every magnitude of the block on the grid.
    Returns the number of blocks checked; raises :class:`SelfCheckFailed` (an ``AssertionError``).
    """
    if quantized.shape != weight.shape:
        raise SelfCheckFailed("NVFP4 fake quantization keeps the shape", tuple(weight.shape), tuple(quantized.shape))
    rows = quantized.detach().float().cpu().reshape(-1, quantized.shape[-1])
    if rows.shape[-1] % block_size:
        raise SelfCheckFailed(f"the last dimension is a multiple of the block size {block_size}", "a multiple",
                              rows.shape[-1])
    blocks = rows.reshape(-1, block_size).abs()
    ordered = blocks.sort(dim=1).values
    distinct = 1 + (ordered.diff(dim=1) != 0).sum(dim=1)
    if int(distinct.max()) > 8:
        raise SelfCheckFailed(f"each block of {block_size} holds at most 8 distinct magnitudes (E2M1)", 8,
                              f"{int(distinct.max())} distinct magnitudes in block {int(distinct.argmax())}")
    grid = torch.tensor(E2M1)
    top = blocks.amax(dim=1, keepdim=True)
    fits = top.squeeze(1) == 0
    for m in E2M1[1:]:
        ratio = blocks / torch.where(top > 0, top / m, torch.ones_like(top))
        off_grid = (ratio.unsqueeze(-1) - grid).abs().amin(dim=-1)
        fits |= (off_grid <= 1e-4).all(dim=1)
    bad = (~fits).nonzero().flatten()
    if bad.numel():
        raise SelfCheckFailed(
            f"every block's magnitudes are E2M1 values times one scale: block {int(bad[0])} magnitudes "
            f"{blocks[bad[0]].unique().tolist()} are off the E2M1 grid", "0 blocks off the grid",
            f"{bad.numel()} of {blocks.shape[0]}")
    return int(blocks.shape[0])


def at_rounding_tie(weight: torch.Tensor, amax: torch.Tensor, block_size: int = 16,
                    rule: str | None = None) -> torch.Tensor:
    """Where ``|x| / block_scale`` lies on an E2M1 boundary, to within 2**-20 relative.

    There the Triton kernel's fp32 division (``div.full.f32``, approximate, not IEEE-rounded) may
    land on either side, while torch divides exactly: the one place the two can round differently.
    ``rule`` is the release's tiny-scale rule (default: the installed release's; see
    ``._nvfp4_cpu_fake_quant``): 0.47 replaces a block scale below 1e-5 with 1, 0.48 only a zero one.
    """
    from .._nvfp4_cpu_fake_quant import RULE_047, installed_release_rule

    rows = weight.float().reshape(-1, weight.shape[-1])
    blocks = rows.reshape(rows.shape[0], -1, block_size)
    global_scale = amax.float() / (6.0 * 448.0)
    block_scale = torch.clamp(blocks.abs().amax(-1, keepdim=True) / (6.0 * global_scale), max=448.0)
    block_scale = block_scale.to(torch.float8_e4m3fn).float() * global_scale
    if (rule or installed_release_rule()) == RULE_047:
        block_scale = torch.where(block_scale >= 1e-5, block_scale, torch.ones_like(block_scale))
    else:
        block_scale = torch.where(block_scale == 0, torch.ones_like(block_scale), block_scale)
    scaled = blocks.abs() / block_scale
    boundaries = torch.tensor(E2M1_BOUNDARIES, device=scaled.device)
    near = ((scaled.unsqueeze(-1) - boundaries).abs() <= boundaries * 2.0**-20).any(-1)
    return near.reshape(weight.shape)
