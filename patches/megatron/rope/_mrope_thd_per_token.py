"""Attention's ``apply_rotary_pos_emb`` for megatron-core 0.14-0.19: an mRoPE table of one row per packed token.

``Attention.forward`` hands packed (THD) q/k to ``apply_rotary_pos_emb`` with ``cu_seqlens`` and the
CP group, and upstream's THD path (``_apply_rotary_pos_emb_thd``, fused or not) treats the table as
indexed by position: per sequence it takes rows ``0 .. len`` (CP=1 on 0.14) or the zig-zag halves
``r`` and ``2 * cp - 1 - r`` of a sequence of ``cp * len`` positions, counted from row 0. 0.15.0
added a second reading, a table of ``cu_seqlens[-1]`` rows (the whole packed batch before the CP
split), from which each sequence's halves are picked at its offset.

Multimodal RoPE has neither: its table comes from position ids, one row per token, and a trainer
that packs sequences under CP splits the position ids with the tokens, so the table a rank holds has
exactly one row per local token, in the tokens' order. ROLL builds its tables so and replaces
``apply_rotary_pos_emb`` with ``apply_rotary_pos_emb_absolute`` (``mcore_adapter/src/mcore_adapter/
models/qwen3_vl/rope_utils.py``), which rotates token ``i`` by row ``i`` through upstream's BSHD
kernel. This wrapper does the same for those calls only: THD input (``cu_seqlens`` given), an mRoPE
config (``config.mrope_section`` set; its tables are always per token) and a table with one row per
local token. It calls upstream's own ``apply_rotary_pos_emb`` on the packed tokens as one BSHD batch
of one sequence (``[t, 1, h, d]``), so the fused kernel, ``mscale`` and the interleaving flags stay
upstream's. With CP=1 on 0.15+ upstream's full-batch reading gives the same rows; every other call
(1-D RoPE, a full-batch table under CP, BSHD) is passed through unchanged.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from patchkit.runtime.probing import get_field

# What the THD path takes that the BSHD path must not be given.
_THD_ONLY = ("cu_seqlens",)


def wrap_apply_rotary_pos_emb(original: Callable[..., Any]) -> Callable[..., Any]:
    """``attention.apply_rotary_pos_emb`` that applies an mRoPE table of one row per packed token row by row."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def apply_rotary_pos_emb(t: torch.Tensor, freqs: Any, *args: Any, **kwargs: Any) -> Any:
        # Attention passes everything after freqs by keyword; bind only a call that does not.
        arguments = signature.bind_partial(t, freqs, *args, **kwargs).arguments if args else dict(kwargs)
        if not is_per_token_mrope_table(t, freqs, arguments.get("config"), arguments.get("cu_seqlens")):
            return original(t, freqs, *args, **kwargs)
        rest = {name: value for name, value in arguments.items() if name not in ("t", "freqs", *_THD_ONLY)}
        return original(t.unsqueeze(1), freqs, **rest).squeeze(1)

    return apply_rotary_pos_emb


def is_per_token_mrope_table(t: torch.Tensor, freqs: Any, config: Any, cu_seqlens: Any) -> bool:
    """Whether ``freqs`` is an mRoPE table with one row per packed token of ``t`` (``[t, h, d]``, THD)."""
    if cu_seqlens is None or get_field(config, "mrope_section", default=None) is None:
        return False
    return isinstance(freqs, torch.Tensor) and freqs.dim() >= 1 and t.dim() == 3 and freqs.size(0) == t.size(0)
