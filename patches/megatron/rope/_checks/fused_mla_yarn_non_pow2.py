"""Self-check of ``megatron.fused_mla_yarn_non_pow2``: MLA's fused KV RoPE equals the unfused path with a
192-wide no-RoPE key and a head count no power-of-two block divides."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, expect

#: float32 on both sides: the fused kernel and the unfused RoPE round differently only in the order
#: of the heads' sum in the RoPE key's gradient.
TOLERANCE = 1e-5


def check_fused_mla_yarn_non_pow2(context: CheckContext) -> None:
    """``fused_apply_mla_rope_for_kv`` forward and backward against megatron-core's unfused RoPE, SBHD and
    packed THD, ``k_dim`` 192, ``v_dim`` 128, 20 heads (the Triton kernels need CUDA). Upstream's kernels
    fail to compile ``tl.arange(0, 192)``."""
    context.require_cuda()
    from ._mla_yarn_kv import KVShape, compare

    for packed in (False, True):
        comparison = compare(KVShape(k_dim=192, v_dim=128, heads=20, packed=packed), torch.float32, context.device)
        expect(comparison.error is None and comparison.largest() <= TOLERANCE,
               f"fused MLA YaRN RoPE for key and value ({comparison.shape}) equals the unfused path "
               "(largest relative difference)", f"<= {TOLERANCE}",
               comparison.error if comparison.error is not None else comparison.differences)
