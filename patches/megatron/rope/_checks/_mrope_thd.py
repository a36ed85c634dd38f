"""Attention with multimodal RoPE on packed (THD) sequences, split over context-parallel ranks as ROLL splits them.

What the ``megatron.mrope_thd_per_token`` check and its tests share. The layer is upstream's own
``SelfAttention`` on its local spec, with an mRoPE config (``mrope_section``); its forward runs up
to core attention, which is :class:`CaptureQueryKey` here: it stops the forward with the rotated
query and key (core attention is not what is tested, and the local one takes no packed input).
The table is upstream's ``MultimodalRotaryEmbedding`` of each token's 3-D position ids.

The reference is ROLL's computation, written from its code (``alibaba/ROLL`` 8eb27cc):

- ``mcore_adapter/src/mcore_adapter/models/sequence_packing_mixin.py``, ``_pack_to_thd`` (used by
  ``_pack_position_ids``): a rank keeps, of each sequence, the chunks ``r`` and ``2 * cp - 1 - r``
  of ``2 * cp`` (``front_start = half_chunk * cp_rank``, ``back_start = padded_len - half_chunk *
  (cp_rank + 1)``), for the position ids as for the tokens, so its table has one row per local token;
- ``mcore_adapter/src/mcore_adapter/models/qwen3_vl/rope_utils.py``, ``apply_rotary_pos_emb_absolute``
  and ``_apply_rotary_pos_emb_thd_absolute``: THD q/k of ``[t, h, d]`` are rotated as one BSHD
  sequence, token ``i`` by row ``i``: ``t * cos(f) + rotate_half(t) * sin(f)``, ``rotate_half`` the
  non-interleaved ``cat(-x2, x1)`` of upstream's ``_rotate_half``.

So each CP rank's rotated q/k must equal ROLL's rotation of the unrotated q/k rows of its tokens
(the linear layers work per token) by the table rows of its tokens. The CP group is stood in for as
in ``_mla_thd_cp`` (attention reads it only as ``size()``/``rank()`` here).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import torch

from ._mla_thd_cp import RankOutcome, on_cp_rank, packed_seq_params, zigzag_rows

# Packed lengths, each a multiple of 2 * CP. The first sequence is text, an image of 2 x 4 patches,
# text again (Qwen-VL's 3-D position ids); the others are text.
SEQUENCE_LENGTHS = (16, 8, 8)
CP_SIZE = 2
HIDDEN_SIZE = 32
# kv_channels 16: 8 rotary frequencies, shared out temporal / height / width.
MROPE_SECTION = [4, 2, 2]


class QueryKeyCaptured(Exception):
    """Raised by :class:`CaptureQueryKey` with the query and key core attention was given."""

    def __init__(self, query: torch.Tensor, key: torch.Tensor) -> None:
        super().__init__("query and key captured")
        self.query = query
        self.key = key


class CaptureQueryKey(torch.nn.Module):
    """Stands in for core attention: ends the forward with the (rotated) query and key it receives."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, query: torch.Tensor, key: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise QueryKeyCaptured(query, key)


def build_attention(device: str = "cpu") -> Any:
    """A tiny ``SelfAttention`` (2 heads of 16 channels) with an mRoPE config and unfused RoPE."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=1, hidden_size=HIDDEN_SIZE, num_attention_heads=2, mrope_section=list(MROPE_SECTION),
        apply_rope_fusion=False, add_bias_linear=False, use_cpu_initialization=True,
    )
    spec = get_gpt_layer_local_spec().submodules.self_attention
    submodules = dataclasses.replace(spec.submodules, core_attention=CaptureQueryKey)
    torch.manual_seed(1234)
    layer = SelfAttention(config, submodules, layer_number=1, attn_mask_type=spec.params["attn_mask_type"])
    return layer.to(device)


def mrope_position_ids(lengths: Sequence[int]) -> torch.Tensor:
    """``[3, tokens]`` temporal / height / width position ids of the packed sequences, each from 0.

    The first sequence: 4 text tokens, an image of one frame of 2 x 4 patches at offset 4, then
    text from one past the image's largest position id, as Qwen-VL's ``get_rope_index`` lays them out.
    """
    sequences = []
    for index, length in enumerate(lengths):
        if index == 0:
            text = torch.arange(4).expand(3, -1)
            image = torch.stack([torch.zeros(8, dtype=torch.long), torch.arange(2).repeat_interleave(4),
                                 torch.arange(4).repeat(2)]) + 4
            after = torch.arange(length - 12).expand(3, -1) + int(image.max()) + 1
            sequences.append(torch.cat([text, image, after], dim=1))
        else:
            sequences.append(torch.arange(length).expand(3, -1))
    return torch.cat(sequences, dim=1)


def mrope_table(position_ids: torch.Tensor, device: str) -> torch.Tensor:
    """Upstream's ``MultimodalRotaryEmbedding`` of ``[3, tokens]`` position ids: ``[tokens, 1, 1, 16]``.

    Built in Megatron's parallel state of one rank (``megatron_on``): its CP group has one rank, so
    the table is not split again; a rank's position ids are split before, as ROLL splits them.
    """
    from megatron.core.models.common.embeddings.rotary_pos_embedding import MultimodalRotaryEmbedding

    embedding = MultimodalRotaryEmbedding(kv_channels=HIDDEN_SIZE // 2, rotary_percent=1.0)
    return embedding(position_ids[:, None, :].to(device), list(MROPE_SECTION))


def rolls_rotation(t: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """ROLL's ``_apply_rotary_pos_emb_thd_absolute``: token ``i`` of ``[t, h, d]`` rotated by row ``i``."""
    freqs = table[:, 0]  # [t, 1, d]: one row per token, broadcast over heads
    first, second = t.chunk(2, dim=-1)
    return t * torch.cos(freqs) + torch.cat((-second, first), dim=-1) * torch.sin(freqs)


def query_key(layer: Any, hidden_states: torch.Tensor, table: Optional[torch.Tensor],
              params: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The query and key (``[t, h, d]``) the layer hands core attention, rotated by ``table`` unless None."""
    try:
        layer(hidden_states, None, rotary_pos_emb=table, packed_seq_params=params)
    except QueryKeyCaptured as captured:
        return captured.query, captured.key
    raise AssertionError("SelfAttention.forward returned without calling core attention")


def compare_with_roll(layer: Any, device: str, lengths: Sequence[int] = SEQUENCE_LENGTHS,
                      cp_size: int = CP_SIZE) -> list[RankOutcome]:
    """Each CP rank's rotated q/k on its zig-zag tokens against ROLL's rotation of those tokens' rows."""
    params = packed_seq_params(lengths, device)
    generator = torch.Generator().manual_seed(99)
    hidden_states = torch.randn(sum(lengths), 1, HIDDEN_SIZE, generator=generator).to(device)
    position_ids = mrope_position_ids(lengths)
    with torch.no_grad():
        plain_query, plain_key = query_key(layer, hidden_states, None, params)
        full_table = mrope_table(position_ids, device)
        outcomes = []
        for rank in range(cp_size):
            rows = zigzag_rows(lengths, cp_size, rank)
            expected_query = rolls_rotation(plain_query[rows], full_table[rows])
            expected_key = rolls_rotation(plain_key[rows], full_table[rows])
            try:
                with on_cp_rank(layer, cp_size, rank):
                    query, key = query_key(layer, hidden_states[rows], mrope_table(position_ids[:, rows], device),
                                           params)
            except Exception as exc:  # upstream's reading of the table can end in a shape error
                outcomes.append(RankOutcome(rank, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
                continue
            difference = max((query - expected_query).abs().max().item(), (key - expected_key).abs().max().item())
            outcomes.append(RankOutcome(rank, difference, None))
    return outcomes
