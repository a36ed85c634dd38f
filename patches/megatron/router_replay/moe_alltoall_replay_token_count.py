"""``megatron.moe_alltoall_replay_token_count``: All-to-all dispatcher counts the tokens the routing map holds
while a router replays.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, ROUTER, TOKEN_DISPATCHER

PATCHES = (
    Patch(
        id="megatron.moe_alltoall_replay_token_count",
        self_check="._checks.moe_alltoall_replay_token_count:check_moe_alltoall_replay_token_count",
        summary="All-to-all dispatcher counts the tokens the routing map holds while a router replays.",
        why=(
            "Dropless routing assumes num_tokens * topk permuted rows; replayed indices that repeat an "
            "expert (padding tokens filled with zeros) hold fewer, and the fused permute and the "
            "expert split then disagree on the row count. The router marks the routing map it returns "
            "while its own replay state replays, whatever class holds that state (a framework's own "
            "RouterReplay too), so the dispatcher needs no registry of replay objects."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_r0.16.0/"
            "megatron/core/transformer/moe/token_dispatcher.py"
        ),
        removal="Remove once upstream derives num_out_tokens from the routing map under replay.",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(
                        f"{TOKEN_DISPATCHER}:MoEAlltoAllTokenDispatcher.preprocess",
                        "._moe_alltoall_replay_token_count:wrap_preprocess",
                    ),
                    Wrap(f"{ROUTER}:TopKRouter.forward", "._moe_alltoall_replay_token_count:wrap_router_forward"),
                ),
            ),
        ),
    ),
)
