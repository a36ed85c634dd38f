"""mRoPE tables of one row per packed token, applied row by row under THD (megatron-core 0.14-0.19).

Declaration module. With multimodal RoPE (``config.mrope_section``) the RoPE "table" is not indexed
by position: it is one row per token, computed from that token's 3-D position ids
(``MultimodalRotaryEmbedding``, or a framework's own mRoPE embedding). A trainer that packs
sequences (THD) under context parallelism splits the position ids as it splits the tokens, so each
CP rank holds exactly the rows of its tokens (ROLL: ``mcore_adapter/.../sequence_packing_mixin.py``
``_pack_position_ids``; inventory row R6). Upstream's THD RoPE reads any table as positions: it
picks each sequence's zig-zag halves from row 0 on (``_get_thd_freqs_on_this_cp_rank``), so every
rank's q/k get other tokens' angles or a shape error; on 0.14 even CP=1 gives every packed sequence
the first sequence's rows. The patch applies such a table row by row (``._mrope_thd_per_token``), as
ROLL's ``_patch_rotary_pos_emb`` does by replacing ``apply_rotary_pos_emb`` process-wide.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_ATTENTION = "megatron.core.transformer.attention"

PATCHES = (
    Patch(
        id="megatron.mrope_thd_per_token",
        self_check="._checks.mrope_thd_per_token:check_mrope_thd_per_token",
        summary=(
            "Attention with multimodal RoPE on packed (THD) sequences applies a table of one row per "
            "local token row by row: each CP rank's q/k get the angles of their own tokens' position ids."
        ),
        why=(
            "_apply_rotary_pos_emb_thd reads every table as positions and selects each sequence's "
            "zig-zag halves from row 0; an mRoPE table is per token, already split over CP ranks "
            "with the tokens (ROLL's sequence packing), so upstream rotates q/k by other tokens' angles "
            "or fails on the shapes (0.14: also with CP=1)."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.2/megatron/core/models/common/"
            "embeddings/rope_utils.py (_apply_rotary_pos_emb_thd, _get_thd_freqs_on_this_cp_rank)"
        ),
        removal=(
            "Remove once THD RoPE takes a table of one row per local token as it is: unchanged in "
            "0.14.0-0.19.2 (0.15.0 added the full-batch table of cu_seqlens[-1] rows, not the "
            "CP-local one)."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="per-token-table",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{_ATTENTION}:apply_rotary_pos_emb", "._mrope_thd_per_token:wrap_apply_rotary_pos_emb"),
                ),
            ),
        ),
    ),
)
