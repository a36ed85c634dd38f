"""``megatron.router_replay_validation``: Replayed indices that do not fit the router's tokens raise a typed
error naming both counts.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, ROUTER

PATCHES = (
    Patch(
        id="megatron.router_replay_validation",
        self_check="._checks.router_replay_validation:check_router_replay_validation",
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
        version_modules=MEGATRON_CORE,
        variants=(
            # On 0.14/0.15 the name is the backport that megatron.router_replay adds to the module.
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(
                        f"{ROUTER}:RouterReplay.get_replay_topk",
                        "._router_replay_validation:wrap_get_replay_topk",
                    ),
                ),
            ),
        ),
    ),
)
