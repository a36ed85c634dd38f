"""Release the routing probabilities MoE token dispatchers keep after a step (megatron-core 0.14-0.19).

Declaration module. The all-to-all dispatcher keeps ``self.probs`` and the all-gather dispatcher
``self.local_probs`` from dispatch until the layer's next forward overwrites them, though the
combine reads only their dtype. Under ``recompute_granularity='full'`` the forward recomputed in
``CheckpointFunction.backward`` runs with grad enabled, so that tensor carries the recomputed graph
back to the checkpoint's detached input and its gradient: per checkpointed chunk, a layer input
and its gradient stay allocated after backward, until the next forward. The patch drops the
reference once the tokens are combined, as upstream's own DeepEP manager does with its
``dispatched_probs`` ("Manually release the metadata to avoid memory leak").
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, TOKEN_DISPATCHER

PATCHES = (
    Patch(
        id="megatron.moe_recompute_release",
        self_check="._checks.moe_recompute_release:check_moe_recompute_release",
        summary=(
            "MoE all-to-all and all-gather token dispatchers drop their routing probabilities once the "
            "tokens are combined, so under full recompute the recomputed graph (each checkpoint's "
            "input and its gradient) is freed with backward instead of at the next forward."
        ),
        why=(
            "With recompute_granularity='full' the dispatcher's probs, set by the forward recomputed "
            "inside CheckpointFunction.backward, keep that graph alive after backward: every MoE "
            "layer's checkpointed input and its gradient stay allocated until the layer runs again "
            "(Megatron-LM issue #3221; verl frees the storage in CheckpointFunction.backward, "
            "NeMo-RL nulls dispatcher.probs, ROLL clears dispatcher tensors on offload)."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/issues/3221",
        removal=(
            "Remove once megatron-core releases the dispatchers' probs after combine: not on main "
            "d98e8a6 (#5197 there only deletes unpermute's locals; #3267 and #5227 are open)."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="release-after-combine",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{TOKEN_DISPATCHER}:MoEAlltoAllTokenDispatcher.combine_postprocess",
                         "._moe_recompute_release:wrap_alltoall_combine_postprocess"),
                    Wrap(f"{TOKEN_DISPATCHER}:MoEAllGatherTokenDispatcher.combine_postprocess",
                         "._moe_recompute_release:wrap_allgather_combine_postprocess"),
                ),
            ),
        ),
    ),
)
