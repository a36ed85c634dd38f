"""A tiny MLA attention on packed (THD) sequences, split over context-parallel ranks, against CP=1.

What the ``megatron.mla_thd_cp_rope`` check and its tests share. The layer is upstream's own
``MLASelfAttention`` on its local spec; only its query/key/value step
(``get_query_key_value_tensors``, where MLA applies RoPE) is driven, so its core attention is
built as :class:`NoCoreAttention` (the local ``DotProductAttention`` has no ``k_channels`` for
MLA's separate head sizes, and core attention is not what is tested).

Context parallelism without more processes: on the path tested MLA reads the CP group only as
``cp_group.size()`` and ``cp_group.rank()`` (``pg_collection.cp``, 0.14: ``model_comm_pgs.cp``,
handed to ``apply_rotary_pos_emb``); the token split is the caller's, as in training. So each
rank is one call on that rank's tokens with :class:`ContextParallelRank` standing in for the
group, on a copy of the layer's process-group collection. The tokens of a rank are Megatron's
THD zig-zag split (``thd_get_partitioned_indices``): each sequence in ``2 * cp`` chunks, rank ``r``
holding chunks ``r`` and ``2 * cp - 1 - r``. The reference is the same layer on the whole packed
batch with CP=1; the linear layers work per token, so each rank's q/k/v must equal the rows of
its tokens in the reference.

Without TransformerEngine, megatron-core 0.16.1 sets ``multi_latent_attention.HAVE_TE = True`` with
``TELinear`` a ``MagicMock`` (its TE extension module stands in for TE classes) and ``MLASelfAttention.__init__``
then fails on ``isinstance(self.linear_proj, TELinear)``; where ``TELinear`` is no class the layer
is built with ``HAVE_TE`` read as ``False``, what it means there (no TE linear to set up).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Optional
from unittest import mock

import torch

# Packed lengths, each a multiple of 2 * CP: with CP=2 a rank holds 12 tokens, fewer than the
# 16 of the first sequence, so a table cut to the local token count is too short for it.
SEQUENCE_LENGTHS = (16, 4, 4)
CP_SIZE = 2
HIDDEN_SIZE = 32


class NoCoreAttention(torch.nn.Module):
    """Stands in for MLA's core attention, which ``get_query_key_value_tensors`` never calls."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()


class ContextParallelRank:
    """What MLA's RoPE reads of a context-parallel group: its size and this process's rank in it."""

    def __init__(self, size: int, rank: int) -> None:
        self._size = size
        self._rank = rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """One CP rank's q/k against the reference rows: the largest difference, or the error raised."""

    rank: int
    max_difference: Optional[float]
    error: Optional[str]


def build_mla(rope_type: str = "rope", config_cp_size: int = 1, device: str = "cpu") -> Any:
    """A tiny ``MLASelfAttention`` (no q LoRA) whose config says ``context_parallel_size=config_cp_size``."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=1, hidden_size=HIDDEN_SIZE, num_attention_heads=2, q_lora_rank=None, kv_lora_rank=16,
        qk_head_dim=8, qk_pos_emb_head_dim=8, v_head_dim=8, rope_type=rope_type, apply_rope_fusion=False,
        add_bias_linear=False, use_cpu_initialization=True,
    )
    spec = get_gpt_layer_local_spec(multi_latent_attention=True).submodules.self_attention
    submodules = dataclasses.replace(spec.submodules, core_attention=NoCoreAttention)
    torch.manual_seed(1234)
    with no_te_linear():
        layer = MLASelfAttention(config, submodules, layer_number=1, attn_mask_type=spec.params["attn_mask_type"])
    # Set after building: 0.14-0.19 validate context_parallel_size against nothing here, and the
    # layer's own groups (TP=CP=1 in the checks) stay what they are.
    config.context_parallel_size = config_cp_size
    return layer.to(device)


@contextlib.contextmanager
def no_te_linear() -> Iterator[None]:
    """``HAVE_TE`` read as ``False`` while the layer is built, where ``TELinear`` is no class (0.16.1 without TE)."""
    from megatron.core.transformer import multi_latent_attention

    if isinstance(getattr(multi_latent_attention, "TELinear", None), type) or not getattr(
            multi_latent_attention, "HAVE_TE", False):
        yield
        return
    with mock.patch.object(multi_latent_attention, "HAVE_TE", False):
        yield


def packed_seq_params(lengths: Sequence[int], device: str) -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=max(lengths), max_seqlen_kv=max(lengths))


def zigzag_rows(lengths: Sequence[int], cp_size: int, rank: int) -> list[int]:
    """The packed rows CP rank ``rank`` holds: chunks ``rank`` and ``2 * cp_size - 1 - rank`` of each sequence."""
    rows: list[int] = []
    start = 0
    for length in lengths:
        chunk = length // (2 * cp_size)
        for index in (rank, 2 * cp_size - 1 - rank):
            rows.extend(range(start + index * chunk, start + (index + 1) * chunk))
        start += length
    return rows


@contextlib.contextmanager
def on_cp_rank(layer: Any, size: int, rank: int) -> Iterator[None]:
    """The layer sees a CP group of ``size`` with this process at ``rank``; its own collection is left alone."""
    name = "pg_collection" if hasattr(layer, "pg_collection") else "model_comm_pgs"  # 0.14: model_comm_pgs
    collection = getattr(layer, name)
    standing_in = copy.copy(collection)
    standing_in.cp = ContextParallelRank(size, rank)
    setattr(layer, name, standing_in)
    try:
        yield
    finally:
        setattr(layer, name, collection)


def query_key(layer: Any, hidden_states: torch.Tensor, params: Any) -> tuple[torch.Tensor, torch.Tensor]:
    query, key = layer.get_query_key_value_tensors(hidden_states, packed_seq_params=params)[:2]
    return query, key


def compare_cp_ranks(layer: Any, device: str, lengths: Sequence[int] = SEQUENCE_LENGTHS,
                     cp_size: int = CP_SIZE) -> list[RankOutcome]:
    """Each CP rank's q/k on its zig-zag tokens against the rows of those tokens with CP=1."""
    params = packed_seq_params(lengths, device)
    generator = torch.Generator().manual_seed(99)
    hidden_states = torch.randn(sum(lengths), 1, HIDDEN_SIZE, generator=generator).to(device)
    with torch.no_grad():
        full_query, full_key = query_key(layer, hidden_states, params)
        outcomes = []
        for rank in range(cp_size):
            rows = zigzag_rows(lengths, cp_size, rank)
            try:
                with on_cp_rank(layer, cp_size, rank):
                    query, key = query_key(layer, hidden_states[rows], params)
            except Exception as exc:  # upstream's cut table ends in a shape error; report it as found
                outcomes.append(RankOutcome(rank, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
                continue
            difference = max((query - full_query[rows]).abs().max().item(), (key - full_key[rows]).abs().max().item())
            outcomes.append(RankOutcome(rank, difference, None))
    return outcomes
