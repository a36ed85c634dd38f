"""A tiny MLA layer whose core attention stands in for TransformerEngine's, on packed (THD) sequences.

What the ``megatron.mla_v_padding`` check and its tests share. The layer is upstream's own
``MLASelfAttention`` on its local spec (linear layers, RoPE, the layer's forward are megatron-core's);
only its core attention is :class:`TECoreAttentionStandIn`, since TransformerEngine's needs CUDA.
The stand-in takes what MLA builds ``TEDotProductAttention`` with, keeps the V head size TE checks V
against (``hidden_size_per_attention_head_v``, from ``v_channels``) and checks it as TE's
``DotProductAttention.forward`` does; for THD input it refuses q/k and V head sizes that differ, as
TE does where no fused kernel serves them (the limit MLA's V padding exists for), unless told to
compute them anyway (the reference). It records the head sizes of every call and computes causal
softmax attention per packed sequence in float32, returning ``[t, heads * v]`` for THD as TE does.

Without TransformerEngine, megatron-core 0.16.1 sets ``HAVE_TE = True`` with mock ``TELinear``: the
layer is built as the RoPE check builds it (``rope/_checks/_mla_thd_cp.py:no_te_linear``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Optional

import torch

from ...rope._checks._mla_thd_cp import no_te_linear, packed_seq_params

HIDDEN_SIZE = 32
HEADS = 2
#: q/k head size 8 + 8 = 16, V head size 8: what MLA hands core attention differs, as in DeepSeek (192, 128).
QK_HEAD_DIM, QK_POS_EMB_HEAD_DIM, V_HEAD_DIM = 8, 8, 8
SEQUENCE_LENGTHS = (6, 4, 2)


class UnequalHeadSizesError(RuntimeError):
    """TE has no kernel here for THD input with q/k and V head sizes that differ."""


@dataclasses.dataclass(frozen=True)
class CoreAttentionCall:
    """The head sizes one core-attention call received, and the V size declared on the module at the call."""

    qkv_format: str
    query_head_dim: int
    key_head_dim: int
    value_head_dim: int
    declared_v_head_dim: int


class TECoreAttentionStandIn(torch.nn.Module):
    """Stands in for ``TEDotProductAttention`` (TE needs CUDA); everything around it is megatron-core's."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 k_channels: Optional[int] = None, v_channels: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__()
        self.hidden_size_per_attention_head_k = k_channels
        self.hidden_size_per_attention_head_v = v_channels
        self.softmax_scale = softmax_scale
        self.causal = "causal" in getattr(attn_mask_type, "name", str(attn_mask_type))
        self.calls: list[CoreAttentionCall] = []
        #: Compute THD input with unequal head sizes instead of refusing it (the unpadded reference).
        self.unequal_thd_heads_allowed = False

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None,
                **kwargs: Any) -> torch.Tensor:
        thd = packed_seq_params is not None and packed_seq_params.qkv_format == "thd"
        self.calls.append(CoreAttentionCall("thd" if thd else "sbhd", query.shape[-1], key.shape[-1],
                                            value.shape[-1], self.hidden_size_per_attention_head_v))
        # TE's DotProductAttention.forward asserts both sizes against what the module was built with.
        assert key.shape[-1] == self.hidden_size_per_attention_head_k, "Keys have head_dim = ..."
        assert value.shape[-1] == self.hidden_size_per_attention_head_v, (
            f"Values have head_dim = {value.shape[-1]}, "
            f"but expected head_dim = {self.hidden_size_per_attention_head_v}!")
        if thd and query.shape[-1] != value.shape[-1] and not self.unequal_thd_heads_allowed:
            raise UnequalHeadSizesError(
                f"no attention kernel for qkv_format=thd with head_dim_qk={query.shape[-1]} != "
                f"head_dim_v={value.shape[-1]}")
        scale = self.softmax_scale or 1.0 / math.sqrt(query.shape[-1])
        if thd:
            bounds = packed_seq_params.cu_seqlens_q.tolist()
            rows = [self._attend(query[a:b], key[a:b], value[a:b], scale)
                    for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
            return torch.cat(rows).flatten(1)  # [t, heads * v], as TE returns THD output
        per_batch = [self._attend(query[:, i], key[:, i], value[:, i], scale) for i in range(query.shape[1])]
        return torch.stack(per_batch, dim=1).flatten(2)  # [s, b, heads * v]

    def _attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
        """Softmax attention of one sequence, ``[s, heads, d]`` each, causal as the layer's mask type says."""
        scores = torch.einsum("qhd,khd->hqk", query.float(), key.float()) * scale
        if self.causal:
            length = query.shape[0]
            future = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), value.float()).to(value.dtype)


def build_mla(device: str = "cpu", **config_overrides: Any) -> Any:
    """A tiny ``MLASelfAttention`` (no q LoRA) with q/k head size 16 and V head size 8, core attention stood in."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(**{
        "num_layers": 1, "hidden_size": HIDDEN_SIZE, "num_attention_heads": HEADS, "q_lora_rank": None,
        "kv_lora_rank": 16, "qk_head_dim": QK_HEAD_DIM, "qk_pos_emb_head_dim": QK_POS_EMB_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM, "rope_type": "rope", "apply_rope_fusion": False, "add_bias_linear": False,
        "use_cpu_initialization": True, **config_overrides})
    spec = get_gpt_layer_local_spec(multi_latent_attention=True).submodules.self_attention
    submodules = dataclasses.replace(spec.submodules, core_attention=TECoreAttentionStandIn)
    torch.manual_seed(1234)
    with no_te_linear():
        layer = MLASelfAttention(config, submodules, layer_number=1, attn_mask_type=spec.params["attn_mask_type"])
    return layer.to(device)


def packed_hidden_states(device: str, lengths: Sequence[int] = SEQUENCE_LENGTHS, seed: int = 99) -> torch.Tensor:
    """``[tokens, 1, hidden]`` inputs of a packed batch (batch is a dummy dimension under THD)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), 1, HIDDEN_SIZE, generator=generator).to(device)


def packed_forward(layer: Any, hidden_states: torch.Tensor, lengths: Sequence[int] = SEQUENCE_LENGTHS,
                   unequal_thd_heads_allowed: bool = False) -> torch.Tensor:
    """The layer's output ``[tokens, 1, hidden]`` on packed (THD) input; the stand-in records the calls.

    With ``unequal_thd_heads_allowed`` the stand-in computes V of its own head size as it comes: the
    reference the padded computation must equal.
    """
    layer.core_attention.unequal_thd_heads_allowed = unequal_thd_heads_allowed
    try:
        output, _ = layer(hidden_states, None, packed_seq_params=packed_seq_params(lengths, str(hidden_states.device)))
    finally:
        layer.core_attention.unequal_thd_heads_allowed = False
    return output


def sequence_by_sequence(layer: Any, hidden_states: torch.Tensor,
                         lengths: Sequence[int] = SEQUENCE_LENGTHS) -> torch.Tensor:
    """The layer on each packed sequence alone, unpacked (``[s, 1, hidden]``, no ``packed_seq_params``), rows joined.

    No release pads V outside THD: core attention gets V of its own head size here, so these rows are
    the unpadded computation a packed forward must equal.
    """
    bounds = [0, *torch.tensor(list(lengths)).cumsum(0).tolist()]
    return torch.cat([layer(hidden_states[a:b], None)[0] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
