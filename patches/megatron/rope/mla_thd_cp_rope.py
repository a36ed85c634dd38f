"""MLA's unfused RoPE with packed (THD) sequences under context parallelism (megatron-core 0.14-0.19).

Declaration module. ``MLASelfAttention.get_query_key_value_tensors`` keeps the full RoPE table for
packed input only when ``config.context_parallel_size`` is above 1, but applies RoPE with the CP
rank and size of its process group (``pg_collection.cp``). A config built with
``context_parallel_size=1`` and run on a CP group (AReaL's MLA configs; inventory row A1) cuts the
table to ``tokens / CP`` rows, and every sequence longer than that fails with a shape error or,
where one row is left, gets the wrong positions. The patch gives upstream's RoPE the table it
needs (``._mla_thd_cp_rope``). verl's MLA patches (V1: mcore < 0.13; V2: ``MultiLatentAttention
.forward`` below 0.16.2, V padding for THD: ``megatron.mla_v_padding``) touch the same code; on
0.14-0.19 the table rule above is upstream's own, unchanged through 0.19.2 and on main d98e8a6.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_MLA = "megatron.core.transformer.multi_latent_attention"

PATCHES = (
    Patch(
        id="megatron.mla_thd_cp_rope",
        self_check="._checks.mla_thd_cp_rope:check_mla_thd_cp_rope",
        summary=(
            "MLA with packed (THD) sequences on a context-parallel group applies RoPE from the full "
            "table even when config.context_parallel_size says 1: each CP rank's q/k equal the "
            "unsplit sequence's rows."
        ),
        why=(
            "MLASelfAttention cuts the RoPE table to the local token count when "
            "config.context_parallel_size == 1, but applies RoPE with pg_collection.cp's rank and size; "
            "a config with context_parallel_size=1 on a CP group (AReaL's MLA configs, which patch "
            "apply_rotary_pos_emb for it) gets a shape error or wrong positions for THD input."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.2/megatron/core/transformer/"
            "multi_latent_attention.py (qkv_up_proj_and_rope_apply: "
            "'packed_seq_params is None or self.config.context_parallel_size == 1')"
        ),
        removal=(
            "Remove once MLA decides the table length from the CP group it applies RoPE with "
            "(pg_collection.cp.size()): unchanged in 0.14.0-0.19.2 and on Megatron-LM main d98e8a6."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="full-table-for-cp-group",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{_MLA}:apply_rotary_pos_emb", "._mla_thd_cp_rope:wrap_apply_rotary_pos_emb"),
                ),
            ),
        ),
    ),
)
