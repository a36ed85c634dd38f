"""Drive one MTP layer's recomputed forward the ways RL jobs do: shared by the self-check and tests/megatron.

``megatron.mtp_recompute`` is about what reaches ``MultiTokenPredictionLayer._checkpointed_forward``:
non-tensor arguments (``packed_seq_params``) and, from 0.18, ``padding_mask``. These helpers run a
layer of the tiny GPT (:mod:`._tiny_gpt`) with those inputs, forward and backward, and return the
gradients, so that a recomputed layer can be compared with a plain one of the same weights.

Stand-in, documented: attention over packed sequences is TransformerEngine's (CUDA-only, absent
from the local layer spec), so :func:`mtp_layer_grads` with ``packed=True`` replaces the layer's
``_proj_and_transformer_layer`` by one that checks ``packed_seq_params`` arrived intact and then
drops it (the local attention runs the tokens as one causal sequence). Recompute, the checkpoint
primitive and everything else are upstream's code.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..._checks._tiny_gpt import VOCAB_SIZE

HIDDEN_SIZE = 64  # the tiny GPT's
TOKENS = 16
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}


def takes_forward_func(layer: Any) -> bool:
    """True for 0.14-0.17, whose ``_checkpointed_forward(forward_func, *args, **kwargs)`` takes the function."""
    return "forward_func" in inspect.signature(type(layer)._checkpointed_forward).parameters


def takes_padding_mask(layer: Any) -> bool:
    """True from 0.18, whose MTP layer forward takes ``padding_mask``."""
    return "padding_mask" in inspect.signature(type(layer).forward).parameters


def checkpointed_call_grad(layer: Any, device: str = "cpu") -> torch.Tensor:
    """0.14-0.17: ``_checkpointed_forward(forward_func, **kwargs)`` given a non-tensor keyword.

    ``forward_func`` multiplies the hidden states by a tensor ``scale`` (3) and asserts the packed
    parameters arrived as given; the returned gradient of the hidden states is then 3 everywhere.
    """
    from megatron.core.packed_seq_params import PackedSeqParams

    hidden = torch.randn(4, 2, 8, device=device, requires_grad=True)
    packed = PackedSeqParams(qkv_format="thd")

    def forward_func(hidden_states: torch.Tensor, scale: torch.Tensor, packed_seq_params: Any = None) -> torch.Tensor:
        assert packed_seq_params is packed, "packed_seq_params lost on the way"
        return hidden_states * scale

    out = layer._checkpointed_forward(forward_func, hidden_states=hidden, scale=torch.tensor(3.0, device=device),
                                      packed_seq_params=packed)
    out.sum().backward()
    assert hidden.grad is not None
    return hidden.grad


def packed_params(device: str = "cpu") -> Any:
    """Two packed sequences (7 and 9 tokens) in THD layout."""
    from megatron.core.packed_seq_params import PackedSeqParams

    cu_seqlens = torch.tensor([0, 7, TOKENS], dtype=torch.int32, device=device)
    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                           max_seqlen_q=9, max_seqlen_kv=9)


def _drop_packed_params(layer: Any, packed: Any) -> None:
    """Install the packed-attention stand-in on this layer instance (see the module docstring)."""
    real = layer._proj_and_transformer_layer
    signature = inspect.signature(real)

    def stand_in(*args: Any, **kwargs: Any) -> torch.Tensor:
        bound = signature.bind(*args, **kwargs)
        assert bound.arguments.get("packed_seq_params") is packed, "packed_seq_params lost on the way"
        bound.arguments["packed_seq_params"] = None
        return real(*bound.args, **bound.kwargs)

    layer._proj_and_transformer_layer = stand_in


def mtp_layer_grads(model: Any, *, packed: bool = False, padding_mask: bool = False, batch_size: int = 1,
                    device: str = "cpu", seed: int = 9) -> dict[str, torch.Tensor]:
    """The first MTP layer's forward (its own ``forward``) and backward; its parameters' gradients.

    ``packed``: a THD batch (one row, two sequences) with ``packed_seq_params``; ``padding_mask``: the
    last five tokens of the last row marked as padding (0.18+). Inputs depend only on ``seed``.
    """
    layer = model.mtp.layers[0]
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (batch_size, TOKENS), generator=generator)
    hidden = torch.randn(TOKENS, batch_size, HIDDEN_SIZE, generator=generator)
    kwargs: dict[str, Any] = dict(
        input_ids=tokens.to(device), position_ids=torch.arange(TOKENS, device=device).expand(batch_size, TOKENS),
        hidden_states=hidden.to(device).requires_grad_(),
        attention_mask=torch.ones(TOKENS, TOKENS, dtype=torch.bool, device=device).triu(1).view(1, 1, TOKENS, TOKENS),
        embedding=model.embedding,
    )
    if packed:
        kwargs["packed_seq_params"] = packed_params(device)
        _drop_packed_params(layer, kwargs["packed_seq_params"])
    if padding_mask:
        mask = torch.zeros(batch_size, TOKENS, dtype=torch.bool)
        mask[-1, -5:] = True
        kwargs["padding_mask"] = mask.to(device)
    out = layer(**kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.square().sum().backward()
    return {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
