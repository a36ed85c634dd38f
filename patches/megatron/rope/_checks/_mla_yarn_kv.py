"""MLA's fused YaRN RoPE for key and value against megatron-core's unfused path, for the
``megatron.fused_mla_yarn_non_pow2`` self-check and its tests.

Both sides are upstream's, as ``MLASelfAttention.get_query_key_value_tensors`` runs them: the fused side
is ``fused_apply_mla_rope_for_kv`` on the cos/sin table ``YarnRotaryEmbedding.get_cached_cos_sin`` gives
(``apply_rope_fusion``); the unfused side splits ``kv`` into the no-RoPE key and the value, applies
``apply_rotary_pos_emb`` to the shared RoPE key (MLA's interleaved layout, YaRN's mscale) and
concatenates it to every head. Forward (key, value) and backward (the gradients of ``kv`` and of the
RoPE key for the same upstream gradients) are compared, in SBHD and in packed THD layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from patchkit.runtime.probing import accepts_parameter

EMB_DIM = 64
#: Packed sequences (THD): four, of 27, 27, 45 and 29 tokens.
CU_SEQLENS = (0, 27, 54, 99, 128)
SBHD_SEQ_LEN, SBHD_BATCH = 96, 2


@dataclasses.dataclass(frozen=True)
class KVShape:
    """``k_dim`` (MLA's ``qk_head_dim``, the key's no-RoPE part), ``v_dim`` (``v_head_dim``) and the heads."""

    k_dim: int
    v_dim: int
    heads: int
    packed: bool

    def __str__(self) -> str:
        layout = "thd" if self.packed else "sbhd"
        return f"k_dim {self.k_dim}, v_dim {self.v_dim}, {self.heads} heads, {layout}"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The largest difference between the fused and unfused results, per output (``error``: what the fused
    call raised, if it did)."""

    shape: KVShape
    differences: dict[str, float]
    error: str | None = None

    def largest(self) -> float:
        return max(self.differences.values(), default=float("inf"))


class _OneRank:
    """A context-parallel group of one rank (what the unfused RoPE and the YaRN table ask of it)."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


@contextlib.contextmanager
def experimental_enabled() -> Iterator[None]:
    """megatron-core's experimental flag on for the block: 0.14 and 0.15 mark the fused MLA RoPE functions
    ``experimental_fn`` (a model with ``apply_rope_fusion`` runs with the flag on); later releases ignore it."""
    from megatron.core import config

    previous = config.ENABLE_EXPERIMENTAL
    config.ENABLE_EXPERIMENTAL = True
    try:
        yield
    finally:
        config.ENABLE_EXPERIMENTAL = previous


def _yarn(device: str) -> torch.nn.Module:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    # A YaRN table as long-context MLA models use it: scaled, with an mscale that is not 1.
    return YarnRotaryEmbedding(EMB_DIM, scaling_factor=40.0, original_max_position_embeddings=64, mscale=1.0,
                               mscale_all_dim=0.8, use_cpu_initialization=device == "cpu")


def _unfused_rope(k_pos_emb: torch.Tensor, rope: torch.nn.Module, seq_len: int,
                  cu_seqlens: torch.Tensor | None, heads: int) -> torch.Tensor:
    """megatron-core's unfused MLA RoPE of the shared key part (``apply_rope_fusion=False``)."""
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_attention_heads=heads, num_layers=1, hidden_size=heads * 8,
                               multi_latent_attention=True, rotary_interleaved=False, apply_rope_fusion=False)
    freqs, mscale = rope(seq_len)
    # 0.19 asks for MLA's interleaved layout by argument; earlier releases read config.multi_latent_attention.
    interleaved = accepts_parameter(apply_rotary_pos_emb, "mla_rotary_interleaved")
    extra = {"mla_rotary_interleaved": True} if interleaved else {}
    return apply_rotary_pos_emb(k_pos_emb, freqs, config=config, cu_seqlens=cu_seqlens, mscale=mscale,
                                cp_group=_OneRank(), **extra)


def compare(shape: KVShape, dtype: torch.dtype, device: str = "cuda", seed: int = 0) -> Comparison:
    """Forward and backward of the fused KV RoPE and of the unfused path on the same random tensors."""
    from megatron.core.fusions.fused_mla_yarn_rope_apply import fused_apply_mla_rope_for_kv

    generator = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator).to(device=device, dtype=dtype)

    k_dim, v_dim, heads = shape.k_dim, shape.v_dim, shape.heads
    if shape.packed:
        cu_seqlens = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device)
        tokens: tuple[int, ...] = (CU_SEQLENS[-1],)
        seq_len = max(b - a for a, b in zip(CU_SEQLENS[:-1], CU_SEQLENS[1:], strict=True))
    else:
        cu_seqlens, tokens, seq_len = None, (SBHD_SEQ_LEN, SBHD_BATCH), SBHD_SEQ_LEN
    kv = randn(*tokens, heads, k_dim + v_dim).requires_grad_(True)
    k_pos_emb = randn(*tokens, 1, EMB_DIM).requires_grad_(True)
    grad_key, grad_value = randn(*tokens, heads, k_dim + EMB_DIM), randn(*tokens, heads, v_dim)
    rope = _yarn(device)

    # Unfused, as MLA runs it without apply_rope_fusion.
    k_no_pe, value = torch.split(kv, [k_dim, v_dim], dim=-1)
    rotated = _unfused_rope(k_pos_emb, rope, seq_len, cu_seqlens, heads)
    key = torch.cat([k_no_pe, rotated.expand(*rotated.shape[:-2], heads, EMB_DIM)], dim=-1)
    torch.autograd.backward((key, value), (grad_key, grad_value))
    expected = {"key": key.detach(), "value": value.detach(), "kv grad": kv.grad, "k_pos_emb grad": k_pos_emb.grad}

    # Fused, as MLA runs it with apply_rope_fusion (cos/sin in the activations' dtype).
    fused_kv = kv.detach().clone().requires_grad_(True)
    fused_emb = k_pos_emb.detach().clone().requires_grad_(True)
    cos, sin = rope.get_cached_cos_sin(seq_len, dtype=dtype, packed_seq=shape.packed)
    try:
        with experimental_enabled():
            fused_key, fused_value = fused_apply_mla_rope_for_kv(fused_kv, fused_emb, cos, sin, EMB_DIM, k_dim,
                                                                 v_dim, cu_seqlens, 0, 1)
        torch.autograd.backward((fused_key, fused_value), (grad_key, grad_value))
    except Exception as exc:  # Triton's compile error on upstream's kernels, as a finding
        return Comparison(shape, {}, f"{type(exc).__name__}: {' '.join(str(exc).split())[-400:]}")
    got = {"key": fused_key.detach(), "value": fused_value.detach(), "kv grad": fused_kv.grad,
           "k_pos_emb grad": fused_emb.grad}
    differences = {}
    for name, want in expected.items():
        assert want is not None and got[name] is not None, name
        if got[name].shape != want.shape:
            differences[name] = float("inf")
            continue
        if want.numel() == 0:  # no value (v_dim 0)
            differences[name] = 0.0
            continue
        scale = 1.0 + want.float().abs()  # relative for large values, absolute near zero
        differences[name] = float(((got[name].float() - want.float()).abs() / scale).max())
    return Comparison(shape, differences)
