"""``megatron.mtp_detach_inputs``: Detach the MTP block's inputs from the main model (every depth's token
embeddings, the first depth's hidden states) so the MTP loss sends no gradient into the embedding and decoder;
later depths still train earlier MTP layers, as 0.19's mtp_detach_heads does.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE, MTP

_GET_EMBEDDINGS = f"{MTP}:MultiTokenPredictionLayer._get_embeddings"

PATCHES = (
    Patch(
        id="megatron.mtp_detach_inputs",
        self_check="._checks.mtp_detach_inputs:check_mtp_detach_inputs",
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
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="detach-in-get-embeddings",
                # 0.20 (main) scatters decoder_input for sequence parallelism inside the method; the
                # detach acts on the returned shard, so it holds there by construction. Not in range:
                # the CPU tests cannot build an MTP model on main without TransformerEngine.
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(Wrap(_GET_EMBEDDINGS, "._mtp_detach_inputs:wrap_get_embeddings"),),
            ),
        ),
    ),
)
