"""``megatron.mtp_recompute``: MultiTokenPredictionLayer's recomputed forward takes non-tensor arguments
(packed_seq_params, ...) by closure (0.14-0.17) and padding_mask (0.18), as upstream 0.19 does.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, MTP

_CHECKPOINTED_FORWARD = f"{MTP}:MultiTokenPredictionLayer._checkpointed_forward"

PATCHES = (
    Patch(
        id="megatron.mtp_recompute",
        self_check="._checks.mtp_recompute:check_mtp_recompute",
        summary=(
            "MultiTokenPredictionLayer's recomputed forward takes non-tensor arguments "
            "(packed_seq_params, ...) by closure (0.14-0.17) and padding_mask (0.18), as upstream 0.19 does."
        ),
        why=(
            "0.14-0.17 pass every argument positionally to the checkpoint primitive, whose "
            "save_for_backward takes only tensors and None: recompute_granularity='full' with MTP and "
            "packed sequences raises TypeError (0.16/0.17); on the fp8 path TransformerEngine's "
            "checkpoint does not track tensors passed as keywords. 0.18 fixed that but its forward passes "
            "padding_mask, which its _checkpointed_forward does not take: every MTP recompute raises "
            "TypeError there. verl and slime patch the method too."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.18.0/megatron/core/transformer/multi_token_prediction.py",
        removal="Remove with support for megatron-core < 0.19 (0.19's method does both).",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="closure-non-tensor-args",
                requires={"megatron-core": ">=0.14,<0.18"},
                installs=(Wrap(_CHECKPOINTED_FORWARD, "._mtp_recompute.v014:wrap_checkpointed_forward"),),
            ),
            Variant(
                label="accept-padding-mask",
                requires={"megatron-core": ">=0.18,<0.19"},
                installs=(Wrap(_CHECKPOINTED_FORWARD, "._mtp_recompute.v018:wrap_checkpointed_forward"),),
            ),
            Variant(
                label="native-0.19",
                requires={"megatron-core": ">=0.19,<0.20"},
                native=(
                    "MultiTokenPredictionLayer._checkpointed_forward takes padding_mask, passes tensors "
                    "positionally and captures non-tensor arguments in a closure (0.19+)"
                ),
            ),
        ),
    ),
)
