"""MLA's fused YaRN RoPE for key and value with any ``k_dim`` (megatron-core 0.14-0.19).

Upstream's Triton kernels ``rotary_fwd_kv_kernel`` and ``rotary_bwd_kv_kernel``
(``megatron/core/fusions/fused_mla_yarn_rope_apply.py``) copy each head's key part with
``tl.arange(0, k_dim)``, and Triton only builds a range whose length is a power of two: a model whose
``qk_head_dim`` (the no-RoPE part of the key) is 192 fails to compile with ``apply_rope_fusion``. They
also mask heads by the offset inside the block (``kv_off < head_num * stride``), so a block of heads
past the first one reaches heads beyond ``head_num`` when ``head_num`` is not a multiple of the
autotuned ``BLOCK_H``.

The kernels here are upstream's with slime's fix (``docker/patch/latest/megatron.patch`` in
THUDM/slime, the hunk for this file): the key is read over the next power of two of ``k_dim``, masked
to ``k_dim``; heads are masked by their index in the whole tensor; a ``v_dim`` of 0 loads and stores no
value. ``ApplyMLARotaryEmbKV`` is upstream's autograd function launching them with that rounded-up
width; it takes the place of upstream's class of the same name, which ``fused_apply_mla_rope_for_kv``
looks up when it is called. The query kernels are not changed (their RoPE part has a power-of-two
width and they never read the no-RoPE part). Adapted from Megatron-LM (Apache-2.0, NVIDIA) as patched
by slime (Apache-2.0).

``triton`` and ``tl`` are upstream's module's own: the real Triton, or the stand-ins it uses where
Triton cannot run (its kernels are then never launched, nor are these).
"""

from __future__ import annotations

from typing import Any

import torch
from megatron.core.fusions.fused_mla_yarn_rope_apply import _get_thd_token_idx, tl, triton

_BLOCK_H = [triton.Config({"BLOCK_H": block}) for block in (1, 2, 4, 8, 16, 32, 64, 128)]


@triton.autotune(configs=_BLOCK_H, key=["emb_dim", "k_dim", "v_dim", "head_num"])
@triton.jit
def rotary_fwd_kv_kernel(
    KV,
    K_POS_EMB,
    O_KEY,
    O_VALUE,
    COS,
    SIN,
    emb_dim: tl.constexpr,
    k_dim: tl.constexpr,
    k_dim_ceil: tl.constexpr,
    v_dim: tl.constexpr,
    head_num: tl.constexpr,
    batch_size,
    seq_num,
    cu_seqlens_kv,
    stride_kv_seq,
    stride_kv_nheads,
    stride_emb_seq,
    stride_k_seq,
    stride_k_nheads,
    stride_v_seq,
    stride_v_nheads,
    cp_rank,
    cp_size,
    BLOCK_H: tl.constexpr,
):
    """Upstream's forward KV kernel; the key read over ``k_dim_ceil`` (a power of two) masked to ``k_dim``,
    heads masked by their index in the tensor."""
    pid_m = tl.program_id(axis=0)
    pid_head = tl.program_id(axis=1)

    if cu_seqlens_kv is None:
        token_idx = pid_m // batch_size
    else:
        token_idx = _get_thd_token_idx(cu_seqlens_kv, pid_m, seq_num, cp_rank, cp_size)

    cos_left = tl.load(COS + token_idx * emb_dim + tl.arange(0, emb_dim // 2))
    sin_left = tl.load(SIN + token_idx * emb_dim + tl.arange(0, emb_dim // 2))
    cos_right = tl.load(COS + token_idx * emb_dim + emb_dim // 2 + tl.arange(0, emb_dim // 2))
    sin_right = tl.load(SIN + token_idx * emb_dim + emb_dim // 2 + tl.arange(0, emb_dim // 2))

    KV_ptr = KV + pid_m * stride_kv_seq
    heads = tl.arange(0, BLOCK_H)[:, None] + pid_head * BLOCK_H
    columns = tl.arange(0, k_dim_ceil)[None, :]
    mask_k = (heads < head_num) & (columns < k_dim)
    mask_heads = heads < head_num
    k = tl.load(KV_ptr + heads * stride_kv_nheads + columns, mask=mask_k)

    K_ptr = O_KEY + pid_m * stride_k_seq
    V_ptr = O_VALUE + pid_m * stride_v_seq
    tl.store(K_ptr + heads * stride_k_nheads + columns, k, mask=mask_k)
    if v_dim > 0:
        v_in_off = heads * stride_kv_nheads + k_dim + tl.arange(0, v_dim)[None, :]
        v = tl.load(KV_ptr + v_in_off, mask=mask_heads)
        tl.store(V_ptr + heads * stride_v_nheads + tl.arange(0, v_dim)[None, :], v, mask=mask_heads)

    EMB = K_POS_EMB + pid_m * stride_emb_seq
    # x1 = t[..., 0::2], x2 = t[..., 1::2]
    x_1 = tl.load(EMB + tl.arange(0, emb_dim // 2) * 2)
    x_2 = tl.load(EMB + tl.arange(0, emb_dim // 2) * 2 + 1)

    x_left = x_1 * cos_left - x_2 * sin_left
    x_right = x_2 * cos_right + x_1 * sin_right
    x_left = x_left.expand_dims(0).broadcast_to(BLOCK_H, emb_dim // 2)
    x_right = x_right.expand_dims(0).broadcast_to(BLOCK_H, emb_dim // 2)

    x_left_off = heads * stride_k_nheads + k_dim + tl.arange(0, emb_dim // 2)[None, :]
    x_right_off = x_left_off + emb_dim // 2
    tl.store(K_ptr + x_left_off, x_left, mask=mask_heads)
    tl.store(K_ptr + x_right_off, x_right, mask=mask_heads)


@triton.autotune(configs=_BLOCK_H, key=["emb_dim", "k_dim", "v_dim", "head_num"])
@triton.jit
def rotary_bwd_kv_kernel(
    dK,
    dV,
    dKV,
    dEMB,
    COS,
    SIN,
    emb_dim: tl.constexpr,
    k_dim: tl.constexpr,
    k_dim_ceil: tl.constexpr,
    v_dim: tl.constexpr,
    head_num: tl.constexpr,
    batch_size,
    seq_num,
    cu_seqlens_kv,
    stride_dk_seq,
    stride_dk_nheads,
    stride_dv_seq,
    stride_dv_nheads,
    stride_dkv_seq,
    stride_dkv_nheads,
    stride_demb_seq,
    cp_rank,
    cp_size,
    BLOCK_H: tl.constexpr,
):
    """Upstream's backward KV kernel with the forward's masks; the RoPE gradient sums every head's, each
    block of heads masked by its index in the tensor."""
    pid_m = tl.program_id(axis=0)
    pid_head = tl.program_id(axis=1)

    if cu_seqlens_kv is None:
        token_idx = pid_m // batch_size
    else:
        token_idx = _get_thd_token_idx(cu_seqlens_kv, pid_m, seq_num, cp_rank, cp_size)

    dKV_ptr = dKV + pid_m * stride_dkv_seq
    dK_ptr = dK + pid_m * stride_dk_seq
    dV_ptr = dV + pid_m * stride_dv_seq
    heads = tl.arange(0, BLOCK_H)[:, None] + pid_head * BLOCK_H
    columns = tl.arange(0, k_dim_ceil)[None, :]
    mask_k = (heads < head_num) & (columns < k_dim)
    mask_heads = heads < head_num

    dk = tl.load(dK_ptr + heads * stride_dk_nheads + columns, mask=mask_k)
    tl.store(dKV_ptr + heads * stride_dkv_nheads + columns, dk, mask=mask_k)
    if v_dim > 0:
        dv = tl.load(dV_ptr + heads * stride_dv_nheads + tl.arange(0, v_dim)[None, :], mask=mask_heads)
        dv_out_off = heads * stride_dkv_nheads + k_dim + tl.arange(0, v_dim)[None, :]
        tl.store(dKV_ptr + dv_out_off, dv, mask=mask_heads)

    if pid_head == 0:
        x_left_accum = tl.zeros((BLOCK_H, emb_dim // 2), dtype=tl.float32)
        x_right_accum = tl.zeros((BLOCK_H, emb_dim // 2), dtype=tl.float32)
        for i in tl.static_range(triton.cdiv(head_num, BLOCK_H)):
            x_off = (tl.arange(0, BLOCK_H)[:, None] + i * BLOCK_H) * stride_dk_nheads + k_dim
            mask = x_off < head_num * stride_dk_nheads
            x_left_off = x_off + tl.arange(0, emb_dim // 2)[None, :]
            x_right_off = x_left_off + emb_dim // 2
            x_left = tl.load(dK_ptr + x_left_off, mask=mask)
            x_right = tl.load(dK_ptr + x_right_off, mask=mask)
            x_left_accum += x_left
            x_right_accum += x_right
        x_left_accum = tl.sum(x_left_accum, axis=0)
        x_right_accum = tl.sum(x_right_accum, axis=0)
        x_left_accum = x_left_accum.to(dEMB.dtype.element_ty)
        x_right_accum = x_right_accum.to(dEMB.dtype.element_ty)

        cos_left = tl.load(COS + token_idx * emb_dim + tl.arange(0, emb_dim // 2))
        sin_left = tl.load(SIN + token_idx * emb_dim + tl.arange(0, emb_dim // 2))
        cos_right = tl.load(COS + token_idx * emb_dim + emb_dim // 2 + tl.arange(0, emb_dim // 2))
        sin_right = tl.load(SIN + token_idx * emb_dim + emb_dim // 2 + tl.arange(0, emb_dim // 2))

        x_1 = x_left_accum * cos_left + x_right_accum * sin_right
        x_2 = -x_left_accum * sin_left + x_right_accum * cos_right
        dEMB_ptr = dEMB + pid_m * stride_demb_seq
        tl.store(dEMB_ptr + tl.arange(0, emb_dim // 2) * 2, x_1)
        tl.store(dEMB_ptr + tl.arange(0, emb_dim // 2) * 2 + 1, x_2)


class ApplyMLARotaryEmbKV(torch.autograd.Function):
    """Upstream's autograd function for MLA's key and value, launching the kernels above."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        kv: torch.Tensor,
        k_pos_emb: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        emb_dim: int,
        k_dim: int,
        v_dim: int,
        cu_seqlens_kv: torch.Tensor | None,
        cp_rank: int,
        cp_size: int,
        rotary_interleaved: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert not rotary_interleaved
        max_seqlen = None
        batch_size = None
        seq_num = None
        if cu_seqlens_kv is None:
            # sbhd
            max_seqlen, batch_size, nheads, headdim = kv.shape
            kv = kv.view(-1, nheads, headdim)
            k_pos_emb = k_pos_emb.view(-1, emb_dim)
            total_seqlen = kv.shape[0]
        else:
            # thd
            seq_num = len(cu_seqlens_kv) - 1
            total_seqlen, nheads, headdim = kv.shape
        assert headdim == k_dim + v_dim
        assert kv.stride(-1) == 1
        assert k_pos_emb.stride(-1) == 1
        assert cos.is_contiguous()
        assert sin.is_contiguous()
        assert emb_dim % 4 == 0

        o_key = kv.new_empty(total_seqlen, nheads, emb_dim + k_dim)
        o_value = kv.new_empty(total_seqlen, nheads, v_dim)

        grid = lambda META: (total_seqlen, triton.cdiv(nheads, META["BLOCK_H"]))  # noqa: E731  (upstream's)
        rotary_fwd_kv_kernel[grid](
            kv, k_pos_emb, o_key, o_value, cos, sin,
            emb_dim, k_dim, triton.next_power_of_2(k_dim), v_dim, nheads,
            batch_size, seq_num, cu_seqlens_kv,
            kv.stride(0), kv.stride(1), k_pos_emb.stride(0),
            o_key.stride(0), o_key.stride(1), o_value.stride(0), o_value.stride(1),
            cp_rank, cp_size,
        )
        ctx.save_for_backward(cos, sin)
        ctx.rotary_interleaved = rotary_interleaved
        ctx.emb_dim = emb_dim
        ctx.k_dim = k_dim
        ctx.v_dim = v_dim
        ctx.cu_seqlens_kv = cu_seqlens_kv
        ctx.cp_rank = cp_rank
        ctx.cp_size = cp_size
        if cu_seqlens_kv is None:
            o_key = o_key.view(max_seqlen, -1, nheads, emb_dim + k_dim)
            o_value = o_value.view(max_seqlen, -1, nheads, v_dim)
        return o_key, o_value

    @staticmethod
    def backward(ctx: Any, dk: torch.Tensor, dv: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        cos, sin = ctx.saved_tensors
        max_seqlen = None
        batch_size = None
        seq_num = None
        if ctx.cu_seqlens_kv is None:
            # sbhd
            max_seqlen, batch_size, nheads, _ = dk.shape
            dk = dk.contiguous().view(-1, nheads, ctx.emb_dim + ctx.k_dim)
            dv = dv.contiguous().view(-1, nheads, ctx.v_dim)
            total_seqlen = dk.shape[0]
        else:
            # thd
            seq_num = len(ctx.cu_seqlens_kv) - 1
            total_seqlen, nheads, _ = dk.shape
        assert dk.stride(-1) == 1
        assert dv.stride(-1) == 1

        d_kv = dk.new_empty(total_seqlen, nheads, ctx.k_dim + ctx.v_dim)
        d_emb = dk.new_empty(total_seqlen, 1, ctx.emb_dim)

        grid = lambda META: (total_seqlen, triton.cdiv(nheads, META["BLOCK_H"]))  # noqa: E731  (upstream's)
        rotary_bwd_kv_kernel[grid](
            dk, dv, d_kv, d_emb, cos, sin,
            ctx.emb_dim, ctx.k_dim, triton.next_power_of_2(ctx.k_dim), ctx.v_dim, nheads,
            batch_size, seq_num, ctx.cu_seqlens_kv,
            dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
            d_kv.stride(0), d_kv.stride(1), d_emb.stride(0),
            ctx.cp_rank, ctx.cp_size,
        )
        if ctx.cu_seqlens_kv is None:
            d_kv = d_kv.view(max_seqlen, batch_size, nheads, ctx.k_dim + ctx.v_dim)
            d_emb = d_emb.view(max_seqlen, batch_size, 1, ctx.emb_dim)
        return d_kv, d_emb, None, None, None, None, None, None, None, None, None
