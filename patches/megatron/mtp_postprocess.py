"""Multi-token prediction (MTP) for RL trainers: main-head logits out, MTP losses still trained.

Declarations only (data); the code lives in the ``_mtp_*`` implementation modules.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

_GPT_MODEL = "megatron.core.models.gpt.gpt_model"
_MTP = "megatron.core.transformer.multi_token_prediction"
_POSTPROCESS = f"{_GPT_MODEL}:GPTModel._postprocess"
_GET_EMBEDDINGS = f"{_MTP}:MultiTokenPredictionLayer._get_embeddings"
_CHECKPOINTED_FORWARD = f"{_MTP}:MultiTokenPredictionLayer._checkpointed_forward"
_VERSION_MODULES = {"megatron-core": "megatron.core"}

PATCHES = (
    Patch(
        id="megatron.mtp_postprocess",
        self_check="._selfchecks:check_mtp_postprocess",
        summary=(
            "GPTModel forward with labels and MTP returns main-head logits [b, s, v]; every MTP "
            "depth's loss is still attached through MTPLossAutoScaler, so MTP layers train. By default "
            "the MTP loss leaves the shared output head alone (PATCHKIT_MTP_OUTPUT_HEAD=trained for "
            "upstream's); labels=None returns logits and runs no MTP on every release "
            "(PATCHKIT_MTP_WITHOUT_LABELS=derive for 0.19's labels from input_ids); per-model via mtp_api.enable."
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
        version_modules=_VERSION_MODULES,
        variants=(
            Variant(
                label="inline-mtp-loss",
                requires={"megatron-core": ">=0.14,<0.17"},
                installs=(Wrap(_POSTPROCESS, "._mtp_postprocess_v014:wrap_postprocess"),),
            ),
            Variant(
                label="process-mtp-loss",
                requires={"megatron-core": ">=0.17,<0.20"},
                installs=(Wrap(_POSTPROCESS, "._mtp_postprocess_v017:wrap_postprocess"),),
            ),
        ),
    ),
    Patch(
        id="megatron.mtp_detach_inputs",
        self_check="._selfchecks:check_mtp_detach_inputs",
        summary=(
            "Detach the MTP block's inputs from the main model (every depth's token embeddings, the "
            "first depth's hidden states) so the MTP loss sends no gradient into the embedding and "
            "decoder; later depths still train earlier MTP layers, as 0.19's mtp_detach_heads does."
        ),
        why=(
            "Keeps an auxiliary MTP head (e.g. a speculative-decoding draft) trainable without "
            "letting its loss move the policy. Upstream has no such switch before 0.19; 0.19's "
            "mtp_detach_heads cuts the same inputs but also freezes the output head for MTP and tags "
            "MTP parameters for separate clipping."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.19.0/megatron/core/transformer/multi_token_prediction.py",
        removal="Remove when callers can use upstream's mtp_detach_heads (0.19+) and accept its semantics.",
        opt_in=True,
        version_modules=_VERSION_MODULES,
        variants=(
            Variant(
                label="detach-in-get-embeddings",
                # 0.20 (main) scatters decoder_input for sequence parallelism inside the method; the
                # detach acts on the returned shard, so it holds there by construction. Not in range:
                # the CPU tests cannot build an MTP model on main without TransformerEngine.
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(Wrap(_GET_EMBEDDINGS, "._mtp_postprocess_detach:wrap_get_embeddings"),),
            ),
        ),
    ),
    Patch(
        id="megatron.mtp_recompute",
        self_check="._selfchecks:check_mtp_recompute",
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
        version_modules=_VERSION_MODULES,
        variants=(
            Variant(
                label="closure-non-tensor-args",
                requires={"megatron-core": ">=0.14,<0.18"},
                installs=(Wrap(_CHECKPOINTED_FORWARD, "._mtp_recompute_v014:wrap_checkpointed_forward"),),
            ),
            Variant(
                label="accept-padding-mask",
                requires={"megatron-core": ">=0.18,<0.19"},
                installs=(Wrap(_CHECKPOINTED_FORWARD, "._mtp_recompute_v018:wrap_checkpointed_forward"),),
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
