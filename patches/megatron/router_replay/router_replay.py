"""``megatron.router_replay``: Record / replay-forward / replay-backward of each MoE layer's top-k expert
indices.
"""

from __future__ import annotations

from patchkit import Add, Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, ROUTER

PATCHES = (
    Patch(
        id="megatron.router_replay",
        self_check="._checks.router_replay:check_router_replay",
        summary="Record / replay-forward / replay-backward of each MoE layer's top-k expert indices.",
        why=(
            "RL trainers must route the training forward (and its activation recompute) exactly as "
            "the rollout log-prob pass routed, or the policy gradient is computed for different "
            "experts than the sampled tokens used. megatron-core has no replay before 0.16."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_r0.16.0/"
            "megatron/core/transformer/moe/router_replay.py"
        ),
        removal="Remove the 0.14/0.15 variant when megatron-core < 0.16 is no longer supported.",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.16"},
                label="megatron-core>=0.14,<0.16: backport of 0.16's replay onto TopKRouter",
                installs=(
                    Add(f"{ROUTER}:RouterReplay", "._router_replay.backport:RouterReplay"),
                    Wrap(f"{ROUTER}:TopKRouter.__init__", "._router_replay.v014:wrap_init"),
                    Wrap(f"{ROUTER}:TopKRouter.routing", "._router_replay.v014:wrap_routing"),
                    Wrap(
                        f"{ROUTER}:topk_routing_with_score_function",
                        "._router_replay.v014:wrap_topk_routing",
                    ),
                ),
            ),
            Variant(
                requires={"megatron-core": ">=0.16,<0.20"},
                native=(
                    "megatron-core 0.16+ ships moe/router_replay.py, enabled by "
                    "TransformerConfig.moe_enable_routing_replay"
                ),
            ),
        ),
    ),
)
