"""Release what MoE token dispatchers keep from a step once its tokens are combined (megatron-core 0.14-0.19).

Declaration module. The all-to-all dispatcher keeps ``self.probs``, the all-gather dispatcher
``self.local_probs`` and the flex dispatcher's communication manager (DeepEP, HybridEP, NCCL EP)
its top-k ``token_probs`` and dispatched probs from dispatch until the layer's next forward
overwrites them, though combining is the last time any of them is read. Under
``recompute_granularity='full'`` the forward recomputed in ``CheckpointFunction.backward`` runs
with grad enabled, so those probs carry the recomputed graph back to the checkpoint's detached
input and its gradient: per checkpointed chunk, a layer input and its gradient stay allocated after
backward, until the next forward. Routing maps, indices, permutation mappings and token counts are
kept the same way (plain tensors, no graph). The patch drops every such reference once the tokens
are combined, as upstream's own DeepEP manager does with its ``dispatched_probs`` from 0.18
("Manually release the metadata to avoid memory leak"). Variants differ by the flex managers a
release has: DeepEP (0.14), HybridEP (0.16), NCCL EP (0.19).

The shared experts' overlap caches (``SharedExpertMLP.cached_fc1_input``, ``cached_fc2_input``,
``cached_fc2_output``, ``cached_output``, ``gate_score``) need nothing: upstream sets each to
``None`` where it is consumed, on every release (the tests check it).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, TOKEN_DISPATCHER

#: The all-to-all and all-gather dispatchers' wraps, the same on every release.
_ALLTOALL_AND_ALLGATHER = (
    Wrap(f"{TOKEN_DISPATCHER}:MoEAlltoAllTokenDispatcher.combine_postprocess",
         "._moe_recompute_release:wrap_alltoall_combine_postprocess"),
    Wrap(f"{TOKEN_DISPATCHER}:MoEAllGatherTokenDispatcher.combine_postprocess",
         "._moe_recompute_release:wrap_allgather_combine_postprocess"),
)
_FLEX = f"{TOKEN_DISPATCHER}:MoEFlexTokenDispatcher.combine_postprocess"

PATCHES = (
    Patch(
        id="megatron.moe_recompute_release",
        self_check="._checks.moe_recompute_release:check_moe_recompute_release",
        summary=(
            "MoE token dispatchers (all-to-all, all-gather, flex: DeepEP, HybridEP, NCCL EP) drop the probs, "
            "routing maps, indices and mappings they keep from a step once its tokens are combined, so "
            "under full recompute the recomputed graph (each checkpoint's input and its gradient) is freed "
            "with backward instead of at the next forward."
        ),
        why=(
            "With recompute_granularity='full' the dispatcher's probs (the flex managers' token_probs), set "
            "by the forward recomputed inside CheckpointFunction.backward, keep that graph alive after "
            "backward: every MoE layer's checkpointed input and its gradient stay allocated until the layer "
            "runs again (Megatron-LM issue #3221; verl frees the storage in CheckpointFunction.backward, "
            "NeMo-RL nulls the dispatchers' probs, routing maps and permutation mappings, ROLL clears "
            "dispatcher tensors on offload)."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/issues/3221",
        removal=(
            "Remove once megatron-core releases the dispatchers' probs after combine (the flex managers' "
            "token_probs included): not on main "
            "d98e8a6 (#5197 there only deletes unpermute's locals; #3267 and #5227 are open)."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="release-after-combine",
                requires={"megatron-core": ">=0.14,<0.16"},
                installs=_ALLTOALL_AND_ALLGATHER + (
                    Wrap(_FLEX, "._moe_recompute_release:wrap_flex_combine_postprocess_v014"),
                ),
            ),
            Variant(
                label="release-after-combine-hybridep",
                requires={"megatron-core": ">=0.16,<0.19"},
                installs=_ALLTOALL_AND_ALLGATHER + (
                    Wrap(_FLEX, "._moe_recompute_release:wrap_flex_combine_postprocess_v016"),
                ),
            ),
            Variant(
                label="release-after-combine-ncclep",
                requires={"megatron-core": ">=0.19,<0.20"},
                installs=_ALLTOALL_AND_ALLGATHER + (
                    Wrap(_FLEX, "._moe_recompute_release:wrap_flex_combine_postprocess_v019"),
                ),
            ),
        ),
    ),
)
