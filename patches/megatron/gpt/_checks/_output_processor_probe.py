"""A fused-style LM-head processor for ``GPTModel.forward(output_processor=...)``, and its reference.

Shared by the ``megatron.output_processor`` self-check and its tests. The processor computes each
label's log-probability from the hidden states and the output weight a few positions at a time, so
at most ``[chunk, batch, vocab]`` logits exist at once, never the whole ``[seq, batch, vocab]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class LogProbContext:
    """What the processor is told (``chunk``) and what it saw (``received``: keyword -> value)."""

    chunk: int = 4
    received: dict[str, Any] = field(default_factory=dict)


def chunked_label_log_probs(*, hidden_states: torch.Tensor, output_layer: Any, output_weight: torch.Tensor | None,
                            labels: torch.Tensor, context: LogProbContext, **rest: Any) -> torch.Tensor:
    """``[batch, seq]`` log-probabilities of ``labels`` from hidden states ``[seq, batch, hidden]``."""
    context.received = dict(rest, hidden_states=hidden_states, output_layer=output_layer,
                            output_weight=output_weight, labels=labels)
    weight = output_weight if output_weight is not None else output_layer.weight
    targets = labels.transpose(0, 1)  # [seq, batch]
    pieces = []
    for start in range(0, hidden_states.shape[0], context.chunk):
        logits = hidden_states[start:start + context.chunk] @ weight.t()  # [chunk, batch, vocab]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        pieces.append(log_probs.gather(-1, targets[start:start + context.chunk].unsqueeze(-1)).squeeze(-1))
    return torch.cat(pieces).transpose(0, 1)


def label_log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The reference: ``[batch, seq]`` log-probabilities of ``labels`` from full ``[batch, seq, vocab]`` logits."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


class OutputLayerCalls:
    """Counts calls of a model's output layer (each one materialises logits) while installed."""

    def __init__(self, model: Any) -> None:
        self.count = 0
        self._handle = model.output_layer.register_forward_hook(self._called)

    def _called(self, *_: Any) -> None:
        self.count += 1

    def remove(self) -> None:
        self._handle.remove()


def build_gpt(share_embeddings_and_output_weights: bool, seq_len: int, vocab_size: int) -> Any:
    """A 2-layer, hidden-64 GPT without MTP, its output weight tied to the embedding or its own."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True,
                               hidden_dropout=0.0, attention_dropout=0.0, params_dtype=torch.float32)
    torch.manual_seed(0)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=vocab_size,
                    max_sequence_length=seq_len,
                    share_embeddings_and_output_weights=share_embeddings_and_output_weights)
