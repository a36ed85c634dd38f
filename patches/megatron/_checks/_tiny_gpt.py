"""A tiny ``GPTModel`` (2 layers, hidden 64, optional MTP) from upstream's local layer specs, and a batch.

Shared by the Megatron self-checks (``patchkit doctor``) and the tests, so a check and its test build
the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

VOCAB_SIZE = 128
SEQ_LEN = 16
BATCH_SIZE = 2
#: The transformer every tiny model of the checks is built from: two small layers, deterministic on CPU.
TINY_TRANSFORMER: dict[str, Any] = dict(
    num_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    use_cpu_initialization=True,
    hidden_dropout=0.0,
    attention_dropout=0.0,
    params_dtype=torch.float32,
)


@dataclass(frozen=True)
class Batch:
    """One causal-LM batch in the layout ``GPTModel.forward`` takes (batch-major ids)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor

    def to(self, device: str | torch.device) -> "Batch":
        return Batch(*(getattr(self, f).to(device) for f in ("input_ids", "position_ids", "attention_mask",
                                                               "labels", "loss_mask")))


def make_batch(
    batch_size: int = BATCH_SIZE, seq_len: int = SEQ_LEN, vocab_size: int = VOCAB_SIZE, seed: int = 7
) -> Batch:
    """Random tokens, next-token labels, a causal mask and a loss mask with a few holes."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
    loss_mask = torch.ones(batch_size, seq_len)
    loss_mask[0, :3] = 0.0  # a masked prompt, so rolling the mask has something to move
    loss_mask[1, -2:] = 0.0
    return Batch(
        input_ids=tokens[:, :-1].contiguous(),
        position_ids=torch.arange(seq_len).unsqueeze(0).expand(batch_size, seq_len).contiguous(),
        # Megatron's convention: True marks positions that must NOT be attended.
        attention_mask=torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1).view(1, 1, seq_len, seq_len),
        labels=tokens[:, 1:].contiguous(),
        loss_mask=loss_mask,
    )


def build_tiny_gpt(
    mtp_num_layers: int | None = 1,
    seed: int = 0,
    position_embedding_type: str = "learned_absolute",
    **config_overrides: Any,
):
    """A 2-layer, hidden-64 ``GPTModel`` built from upstream's local (non-TE) layer specs.

    Deterministic for a given ``seed``: weights are initialised on CPU from the CPU generator.
    ``position_embedding_type`` is ``GPTModel``'s (``"rope"``: no position ids needed).
    """
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    config_kwargs: dict[str, Any] = dict(
        TINY_TRANSFORMER,
        mtp_num_layers=mtp_num_layers,
        # 0.14/0.15 default this to None; 0.16+ to 0.1. Pin it so every version scales alike.
        mtp_loss_scaling_factor=0.1,
    )
    config_kwargs.update(config_overrides)
    config = TransformerConfig(**config_kwargs)
    layer_spec = get_gpt_layer_local_spec()
    mtp_block_spec = (
        get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False)
        if mtp_num_layers
        else None
    )
    torch.manual_seed(seed)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=VOCAB_SIZE,
        max_sequence_length=SEQ_LEN,
        mtp_block_spec=mtp_block_spec,
        position_embedding_type=position_embedding_type,
    )
