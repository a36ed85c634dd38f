"""MoE router replay: record top-k routing once, replay it in later passes (megatron-core).

Declarations only. The behaviour is driven through ``router_replay_api``; index tensors are
converted between per-sample and packed THD order by its ``pack`` / ``unpack``.
"""

from patchkit import Add, Patch, Variant, Wrap

ROUTER = "megatron.core.transformer.moe.router"
DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"

PATCHES = (
    Patch(
        id="megatron.router_replay",
        self_check="._selfchecks:check_router_replay",
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
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.16"},
                label="megatron-core>=0.14,<0.16: backport of 0.16's replay onto TopKRouter",
                installs=(
                    Add(f"{ROUTER}:RouterReplay", "._router_replay_backport:RouterReplay"),
                    Wrap(f"{ROUTER}:TopKRouter.__init__", "._router_replay_v014:wrap_init"),
                    Wrap(f"{ROUTER}:TopKRouter.routing", "._router_replay_v014:wrap_routing"),
                    Wrap(
                        f"{ROUTER}:topk_routing_with_score_function",
                        "._router_replay_v014:wrap_topk_routing",
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
    Patch(
        id="megatron.router_replay_validation",
        self_check="._selfchecks:check_router_replay_validation",
        summary="Replayed indices that do not fit the router's tokens raise a typed error naming both counts.",
        why=(
            "Upstream replays with scores.gather(1, indices) unchecked: a target packed with other "
            "padding than the model input (the FP8 THD padding case) either fails deep in gather or "
            "silently routes tokens with another token's experts."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_r0.16.0/"
            "megatron/core/transformer/moe/router_replay.py"
        ),
        removal="Remove once upstream checks the replayed tensor's shape (not as of 0.19.2).",
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            # On 0.14/0.15 the name is the backport that megatron.router_replay adds to the module.
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(
                        f"{ROUTER}:RouterReplay.get_replay_topk",
                        "._router_replay_checks:wrap_get_replay_topk",
                    ),
                ),
            ),
        ),
    ),
    Patch(
        id="megatron.moe_alltoall_replay_token_count",
        self_check="._selfchecks:check_moe_alltoall_replay_token_count",
        summary="All-to-all dispatcher counts the tokens the routing map holds while a router replays.",
        why=(
            "Dropless routing assumes num_tokens * topk permuted rows; replayed indices that repeat an "
            "expert (padding tokens filled with zeros) hold fewer, and the fused permute and the "
            "expert split then disagree on the row count."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_r0.16.0/"
            "megatron/core/transformer/moe/token_dispatcher.py"
        ),
        removal="Remove once upstream derives num_out_tokens from the routing map under replay.",
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(
                        f"{DISPATCHER}:MoEAlltoAllTokenDispatcher.preprocess",
                        "._alltoall_replay_token_count:wrap_preprocess",
                    ),
                ),
            ),
        ),
    ),
)
