"""MLA's ``apply_rotary_pos_emb`` for megatron-core 0.14-0.19: the RoPE table cut short for THD + CP restored.

In ``MLASelfAttention.get_query_key_value_tensors`` (unfused RoPE, ``qkv_up_proj_and_rope_apply``)
upstream shortens the table to the local token count unless the input is packed *and* context
parallel, and it reads "context parallel" from ``self.config.context_parallel_size``::

    elif packed_seq_params is None or self.config.context_parallel_size == 1:
        rotary_pos_emb = rotary_pos_emb[0:q_len]

The RoPE it then applies reads the CP rank and size from the group it is given
(``cp_group=self.pg_collection.cp``; 0.14: ``self.model_comm_pgs.cp``), and for THD input selects
each sequence's zig-zag halves from the full-length table (``_get_thd_freqs_on_this_cp_rank``).
When the two disagree (a config built with ``context_parallel_size=1`` run on a CP group of 2 or
more, as AReaL's MLA configs are), the table reaches the RoPE with ``q_len = tokens / CP`` rows
while a sequence of ``S`` tokens needs ``S``: the later half of each sequence gets too few rows,
a shape error, or, where one row is left, silently the wrong angle by broadcasting.

This wrapper sits on the name ``multi_latent_attention`` calls (that module's binding of
``rope_utils.apply_rotary_pos_emb``; nothing else is touched). For THD input on a CP group of
more than one rank it extends a table shorter than the longest sequence to that length before
calling upstream's own RoPE. MLA's tables are ``outer(positions, inv_freq)`` with positions
``0, 1, 2, ...`` (``RotaryEmbedding.get_freqs_non_repeated``, ``YarnRotaryEmbedding.forward``,
the mscale kept apart), so row ``p`` is ``p`` times row 1: the rows rebuilt equal what upstream
computes with a consistent config (bit for bit without ``seq_len_interpolation_factor``). Every
other call is passed through unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .._errors import MlaRopeTableError


def wrap_apply_rotary_pos_emb(original: Callable[..., Any]) -> Callable[..., Any]:
    """``multi_latent_attention.apply_rotary_pos_emb`` that gives upstream's RoPE the full THD table under CP."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def apply_rotary_pos_emb(t: torch.Tensor, freqs: Any, *args: Any, **kwargs: Any) -> Any:
        # MLA passes everything after freqs by keyword; bind only a call that does not.
        arguments = signature.bind_partial(t, freqs, *args, **kwargs).arguments if args else kwargs
        cu_seqlens = arguments.get("cu_seqlens")
        cp_group = arguments.get("cp_group")
        if cu_seqlens is not None and cp_group is not None and cp_group.size() > 1:
            freqs = full_thd_rope_table(freqs, cu_seqlens)
        return original(t, freqs, *args, **kwargs)

    return apply_rotary_pos_emb


def full_thd_rope_table(freqs: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``freqs`` with at least as many rows as the longest sequence of ``cu_seqlens`` (full, pre-CP lengths).

    A table long enough is returned as it is. A shorter one is the head of ``outer(positions,
    inv_freq)``, cut by MLA at the local token count: rows ``0 .. needed - 1`` are ``p * freqs[1]``.
    """
    needed = int((cu_seqlens[1:] - cu_seqlens[:-1]).max().item()) if cu_seqlens.numel() > 1 else 0
    rows = freqs.size(0)
    if rows >= needed:
        return freqs
    if rows < 2:
        raise MlaRopeTableError(rows, needed, "fewer than two rows give no angle per position")
    if bool(freqs[0].any()):
        raise MlaRopeTableError(rows, needed, "row 0 is not position 0 (an offset table)")
    positions = torch.arange(needed, device=freqs.device, dtype=freqs.dtype)
    return positions.view(-1, *([1] * (freqs.dim() - 1))) * freqs[1:2]
