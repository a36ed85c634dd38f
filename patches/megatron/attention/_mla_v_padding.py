"""MLA's core attention on megatron-core 0.14-0.17: V padded to the q/k head size for THD input, as 0.18 does.

megatron-core 0.18.0 routes every call MLA makes to its core attention, direct
(``MultiLatentAttention.forward``) or checkpointed (``Attention._checkpointed_attention_forward``,
run again in backward), through ``MultiLatentAttention._run_core_attention``::

    value, need_v_pad, orig_v_dim, padded_v_dim = _prepare_mla_core_attention_value(...)
    # need_v_pad: packed_seq_params.qkv_format == "thd", config.experimental_attention_variant is None,
    #             value is not None and query.shape[-1] != value.shape[-1]; value = F.pad(value, [0, q - v])
    core_attention.hidden_size_per_attention_head_v = padded_v_dim   # TE asserts V's size against it
    try:
        core_attn_out = self.core_attention(query, key, value, ...)
    finally:
        core_attention.hidden_size_per_attention_head_v = orig_v_dim
    return _trim_mla_core_attention_output(...)   # [t, h * padded] -> [t, h, padded][..., :orig]

0.14-0.17 call ``self.core_attention`` directly at both places. Here the same steps run as a
forward pre-hook (pad, set the declared V size) and an always-called forward hook (restore, trim)
on the layer's core attention module, so they take effect wherever MLA calls it, the recomputation
of checkpointed core attention in backward included, without a copy of MLA's forward. The hooks
are put on a layer's core attention by its first forward through :func:`wrap_forward` (layers
built before the patch installed included) and taken off every layer by :func:`stop_padding`.

One difference from 0.18: V wider than q/k is left as it is. 0.18 pads it by a negative width,
which cuts V to the q/k size and then fails on the output projection's shape.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch.utils.hooks import RemovableHandle

from patchkit.runtime.probing import get_field

logger = logging.getLogger(__name__)

#: Where TE's ``DotProductAttention`` keeps the V head size it checks V against.
DECLARED_V_SIZE = "hidden_size_per_attention_head_v"


class _Padded(NamedTuple):
    """What one core-attention call padded: V's own head size, the padded one, the declared size to restore."""

    orig_v_dim: int
    padded_v_dim: int
    declared_v_dim: Optional[int]


class ValuePadding:
    """The pair of hooks on one MLA layer's core attention, and what the call in flight padded.

    ``config`` is the MLA layer's config (``experimental_attention_variant``: 0.18 leaves DSA's
    core attention alone, and so does this). Core attention is not re-entered while it runs, so a
    stack holds at most one call; it keeps the pair consistent if a hook of another party raises
    between them.
    """

    def __init__(self, config: Any) -> None:
        self._config = config
        self._in_flight: list[Optional[_Padded]] = []

    def before(self, module: torch.nn.Module, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> Optional[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Forward pre-hook: V (the third positional argument, as MLA passes it) padded with zeros."""
        value = args[2] if len(args) > 2 else None
        if not needs_padding(self._config, args[0] if args else None, value, kwargs.get("packed_seq_params")):
            self._in_flight.append(None)
            return None
        orig_v_dim = value.shape[-1]
        value = F.pad(value, [0, args[0].shape[-1] - orig_v_dim])
        declared = getattr(module, DECLARED_V_SIZE, None)
        if declared is not None and declared != value.shape[-1]:
            setattr(module, DECLARED_V_SIZE, value.shape[-1])
        else:
            declared = None
        self._in_flight.append(_Padded(orig_v_dim, value.shape[-1], declared))
        return (*args[:2], value, *args[3:]), kwargs

    def after(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> Any:
        """Forward hook, called on errors too: the declared V size restored, the output cut back to V's size."""
        padded = self._in_flight.pop() if self._in_flight else None
        if padded is None:
            return None
        if padded.declared_v_dim is not None:
            setattr(module, DECLARED_V_SIZE, padded.declared_v_dim)
        if not isinstance(output, torch.Tensor):  # the call raised (output None): nothing to cut
            return None
        return trim_output(output, padded.orig_v_dim, padded.padded_v_dim)


def needs_padding(config: Any, query: Any, value: Any, packed_seq_params: Any) -> bool:
    """0.18's ``need_v_pad``: THD input, no experimental attention variant, V narrower than q/k."""
    return (
        get_field(packed_seq_params, "qkv_format") == "thd"
        and get_field(config, "experimental_attention_variant") is None
        and isinstance(query, torch.Tensor)
        and isinstance(value, torch.Tensor)
        and query.shape[-1] > value.shape[-1]
    )


def trim_output(core_attn_out: torch.Tensor, orig_v_dim: int, padded_v_dim: int) -> torch.Tensor:
    """0.18's ``_trim_mla_core_attention_output``: ``[t, h * padded]`` or ``[t, h, padded]`` to ``[t, h, orig]``."""
    if core_attn_out.ndim == 2:
        core_attn_out = core_attn_out.reshape(*core_attn_out.shape[:-1], -1, padded_v_dim)
    return core_attn_out[..., :orig_v_dim]


# Core attention module -> its hooks' handles. Weak keys: a layer that is freed takes its entry along.
_HOOKED: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[RemovableHandle, RemovableHandle]]" = (
    weakref.WeakKeyDictionary())
_HOOKED_LOCK = threading.Lock()


def pad_values_of(layer: torch.nn.Module) -> None:
    """Put the padding hooks on ``layer.core_attention`` unless they are there (once per module)."""
    core_attention = getattr(layer, "core_attention", None)
    if not isinstance(core_attention, torch.nn.Module) or core_attention in _HOOKED:
        return
    with _HOOKED_LOCK:
        if core_attention in _HOOKED:
            return
        padding = ValuePadding(getattr(layer, "config", None))
        _HOOKED[core_attention] = (
            core_attention.register_forward_pre_hook(padding.before, with_kwargs=True),
            core_attention.register_forward_hook(padding.after, with_kwargs=True, always_call=True),
        )


def wrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MultiLatentAttention.forward`` that first makes sure the layer's core attention pads V for THD input."""

    @functools.wraps(original)
    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        pad_values_of(self)
        return original(self, *args, **kwargs)

    return forward


def start_padding() -> None:
    """Nothing to register up front: each layer's core attention gets its hooks on its first forward."""


def stop_padding() -> None:
    """Take the padding hooks off every core attention that has them."""
    with _HOOKED_LOCK:
        handles = list(_HOOKED.items())
        _HOOKED.clear()
    for _, (before, after) in handles:
        before.remove()
        after.remove()
    if handles:
        logger.debug("patchkit: megatron.mla_v_padding: padding hooks taken off %d MLA core attentions", len(handles))
