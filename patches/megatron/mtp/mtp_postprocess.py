"""``megatron.mtp_postprocess``: GPTModel forward with labels and MTP returns main-head logits [b, s, v];
every MTP depth's loss is still attached through MTPLossAutoScaler, so MTP layers train.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import GPT_MODEL, MEGATRON_CORE

_POSTPROCESS = f"{GPT_MODEL}:GPTModel._postprocess"

PATCHES = (
    Patch(
        id="megatron.mtp_postprocess",
        self_check="._checks.mtp_postprocess:check_mtp_postprocess",
        summary=(
            "GPTModel forward with labels and MTP returns main-head logits [b, s, v]; every MTP "
            "depth's loss is still attached through MTPLossAutoScaler, so MTP layers train. By default "
            "the MTP loss leaves the shared output head alone (PATCHKIT_MTP_OUTPUT_HEAD=trained for "
            "upstream's); labels=None returns logits and runs no MTP on every release "
            "(PATCHKIT_MTP_WITHOUT_LABELS=derive for 0.19's labels from input_ids); per-model via mtp.enable."
        ),
        why=(
            "RL trainers compute log-probs and the policy loss from logits themselves; upstream "
            "returns only the LM loss when labels are given, and computes the MTP loss only on "
            "that path. Upstream 0.14-0.16 also divide by a zero token count (NaN gradients on a fully "
            "masked CP rank), raise on labels=None with MTP and weigh per-token MTP losses unlike 0.17+ "
            "(no rescale by the tokens rolled off); 0.19 attaches MTP losses to a forward without labels "
            "(a reference model's log-prob pass). Without MTP the call is upstream's."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.19.0/megatron/core/models/gpt/gpt_model.py",
        removal=(
            "Remove once upstream returns logits with the MTP loss attached for caller-given "
            "labels (0.19 does so only for labels derived from input_ids)."
        ),
        # Opt-in: it changes what forward(labels=...) returns, which a pre-training job sharing the
        # process-wide apply_all() must not get by surprise.
        opt_in=True,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="inline-mtp-loss",
                requires={"megatron-core": ">=0.14,<0.17"},
                installs=(Wrap(_POSTPROCESS, "._mtp_postprocess.v014:wrap_postprocess"),),
            ),
            Variant(
                label="process-mtp-loss",
                requires={"megatron-core": ">=0.17,<0.20"},
                installs=(Wrap(_POSTPROCESS, "._mtp_postprocess.v017:wrap_postprocess"),),
            ),
        ),
    ),
)
