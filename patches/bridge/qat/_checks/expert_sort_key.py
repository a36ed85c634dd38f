"""Self-check of ``bridge.expert_sort_key``: The export's sort key orders experts numerically in both namings
(local_experts.N and weightN).
"""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, expect

MIXED_NAMES = (
    "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight11",
    "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "embedding.word_embeddings.weight",
)

#: Layers in order, experts numerically within a layer, whichever naming.
SORTED_NAMES = [
    "embedding.word_embeddings.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight11",
    "decoder.layers.1.self_attention.linear_qkv.weight",
]


def check_expert_sort_key(context: CheckContext) -> None:
    """The export's sort key orders experts numerically in both namings (local_experts.N and weightN)."""
    from megatron.bridge.models.conversion import model_bridge

    found = sorted(MIXED_NAMES, key=model_bridge.extract_sort_key)
    expect(found == SORTED_NAMES, "sorted(names, key=model_bridge.extract_sort_key)", SORTED_NAMES, found)
