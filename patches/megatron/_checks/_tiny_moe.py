"""A tiny MoE ``GPTModel`` with router replay enabled, and the batches and probes its checks use.

Shared by the router replay self-checks (``patchkit doctor``) and ``tests/megatron`` (re-exported by
``replay_models``), so a check and its tests route the same model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .. import router_replay as replay
from ._tiny_gpt import TINY_TRANSFORMER

VOCAB_SIZE = 128
NUM_EXPERTS = 8
TOPK = 2


def build_tiny_moe(
    max_sequence_length: int = 32, seed: int = 0, *, pre_process: bool = True, post_process: bool = True,
    vp_stage: int | None = None, **overrides: Any,
):
    """2-layer, hidden-64 GPT whose MLPs are 8-expert top-2 MoE layers with replay enabled.

    ``moe_layer_freq`` (a hybrid dense/MoE stack) builds from upstream's decoder block spec;
    ``mtp_num_layers`` adds upstream's MTP block (MoE MLPs too). ``pre_process`` /
    ``post_process`` / ``vp_stage`` build one pipeline (virtual) stage.

    Sigmoid scores with an expert bias: the bias changes which experts are selected but not the
    probabilities of the selected ones, so a replay after changing the bias must reproduce the
    recorded pass bit for bit. ``add_bias_linear=False``: the local expert MLPs need it on CPU.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs: dict[str, Any] = dict(
        TINY_TRANSFORMER,
        ffn_hidden_size=32,
        add_bias_linear=False,
        num_moe_experts=NUM_EXPERTS,
        moe_router_topk=TOPK,
        moe_token_dispatcher_type="alltoall",
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
    )
    kwargs.update(overrides)
    config = TransformerConfig(**kwargs)
    replay.enable(config)
    torch.manual_seed(seed)
    layer_spec = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
    extra: dict[str, Any] = {}
    if "moe_layer_freq" in overrides:
        import inspect

        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

        spec_kwargs: dict[str, Any] = {"use_transformer_engine": False}
        if vp_stage is not None and "vp_stage" in inspect.signature(get_gpt_decoder_block_spec).parameters:
            spec_kwargs["vp_stage"] = vp_stage
        layer_spec = get_gpt_decoder_block_spec(config, **spec_kwargs)
    if overrides.get("mtp_num_layers"):
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

        mtp_layer = get_gpt_layer_local_spec(num_experts=NUM_EXPERTS, moe_grouped_gemm=False)
        extra["mtp_block_spec"] = get_gpt_mtp_block_spec(config, mtp_layer, use_transformer_engine=False)
    if vp_stage is not None:
        extra["vp_stage"] = vp_stage
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=VOCAB_SIZE,
        max_sequence_length=max_sequence_length,
        pre_process=pre_process,
        post_process=post_process,
        **extra,
    )


def routers(model) -> list:
    from megatron.core.transformer.moe.router import TopKRouter

    return [m for m in model.modules() if isinstance(m, TopKRouter)]


def dispatchers(model) -> list:
    """Each MoE layer's all-to-all dispatcher (a plain object on the layer, not a submodule)."""
    from megatron.core.transformer.moe.moe_layer import MoELayer
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    found = [m.token_dispatcher for m in model.modules() if isinstance(m, MoELayer)]
    assert found and all(isinstance(d, MoEAlltoAllTokenDispatcher) for d in found)
    return found


@dataclass
class Batch:
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor

    def to(self, device: Any) -> "Batch":
        return Batch(self.input_ids.to(device), self.position_ids.to(device), self.attention_mask.to(device),
                     self.labels.to(device))


def causal_batch(batch_size: int = 2, seq_len: int = 16, seed: int = 7) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB_SIZE, (batch_size, seq_len + 1), generator=generator)
    return Batch(
        input_ids=tokens[:, :-1].contiguous(),
        position_ids=torch.arange(seq_len).expand(batch_size, seq_len).contiguous(),
        attention_mask=torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1).view(1, 1, seq_len, seq_len),
        labels=tokens[:, 1:].contiguous(),
    )


class RoutingCapture:
    """Keeps every router's routing map (and probs) from each forward, in layer order."""

    def __init__(self, model) -> None:
        self.maps: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []
        self._handles = [r.register_forward_hook(self._hook) for r in routers(model)]

    def _hook(self, module, inputs, output) -> None:
        probs, routing_map = output
        self.maps.append(routing_map.detach().clone())
        self.probs.append(probs.detach().clone())

    def take(self) -> list[torch.Tensor]:
        """The routing maps of the one forward since the last take (probs stay in ``last_probs``)."""
        assert len(self.maps) == len(self._handles), "expected one routing map per router"
        maps, self.last_probs = self.maps, self.probs
        self.maps, self.probs = [], []
        return maps

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def forward_loss(model, batch: Batch) -> torch.Tensor:
    """Per-token LM loss, [batch, seq] (upstream's own cross-entropy)."""
    return model(batch.input_ids, batch.position_ids, batch.attention_mask, labels=batch.labels)


def shift_expert_bias(model, seed: int = 3, scale: float = 2.0) -> None:
    """Change which experts every router selects without changing the selected experts' probs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in routers(model):
            shift = torch.randn(router.expert_bias.shape, generator=generator) * scale
            router.expert_bias.add_(shift.to(router.expert_bias.device))


def thd_batch(layout: Any, per_sample_ids: torch.Tensor) -> Batch:
    """The packed sequence as one row, attention confined to each padded sample (THD semantics).

    The local (non-TE) attention has no THD kernel; a block-diagonal causal mask over the packed
    row gives every token the same context it has in THD, so routing and loss per token match.
    """
    ids = replay.pack(per_sample_ids.unsqueeze(-1), layout, fill=0).view(1, -1)
    total = ids.shape[1]
    bounds = layout.cu_seqlens_padded
    sample = torch.bucketize(torch.arange(total), bounds[1:], right=True)
    position = torch.arange(total) - bounds[sample]
    same_sample = sample.unsqueeze(0) == sample.unsqueeze(1)
    causal = torch.ones(total, total, dtype=torch.bool).tril()
    return Batch(
        input_ids=ids,
        position_ids=position.view(1, -1),
        attention_mask=~(same_sample & causal).view(1, 1, total, total),
        labels=ids.roll(-1, dims=1),
    )
