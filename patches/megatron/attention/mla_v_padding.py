"""MLA's V padded to the q/k head size for packed (THD) sequences (megatron-core 0.14-0.17; native from 0.18).

Declaration module. In Multi-Latent Attention the query/key head size (``qk_head_dim +
qk_pos_emb_head_dim``, 192 in DeepSeek-V3) differs from the value head size (``v_head_dim``, 128).
TransformerEngine serves packed THD input (and context parallelism on it) with equal head sizes on
every backend, unequal ones only where a fused kernel exists for them (FlashAttention 2 has no MLA,
the unfused backend no THD), so megatron-core 0.18.0 pads V with zeros up to the q/k head size
before MLA's core attention and cuts the output back (Megatron-LM #3003,
``MultiLatentAttention._run_core_attention``). Zero columns of V only add zero columns to the
output: the rows kept are the same attention. 0.14-0.17 hand TE the unequal sizes; verl's
``MultiLatentAttention.forward`` patch (its row V2, gated to mcore < 0.16.2) pads for them. The
patch does on 0.14-0.17 what 0.18 does, at the same place: every call MLA makes to its core
attention (``._mla_v_padding``).
"""

from __future__ import annotations

from patchkit import Call, Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_MLA = "megatron.core.transformer.multi_latent_attention"
_IMPLEMENTATION = "._mla_v_padding"

PATCHES = (
    Patch(
        id="megatron.mla_v_padding",
        self_check="._checks.mla_v_padding:check_mla_v_padding",
        summary=(
            "MLA with packed (THD) sequences hands its core attention V padded with zeros to the q/k head "
            "size and cuts the output back (0.18's padding on 0.14-0.17)."
        ),
        why=(
            "MLA's q/k head size (qk_head_dim + qk_pos_emb_head_dim) differs from v_head_dim; TransformerEngine "
            "has THD kernels for unequal head sizes only on some backends and GPUs, so 0.14-0.17 fail where "
            "0.18 (which pads V) runs. verl patches MultiLatentAttention.forward for it."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.18.0/megatron/core/transformer/"
            "multi_latent_attention.py (_prepare_mla_core_attention_value, _run_core_attention; Megatron-LM #3003)"
        ),
        removal="Native from megatron-core 0.18.0; remove with support for 0.17.",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="v018-backport",
                requires={"megatron-core": ">=0.14,<0.18"},
                installs=(
                    Wrap(f"{_MLA}:MultiLatentAttention.forward", f"{_IMPLEMENTATION}:wrap_forward"),
                    # The padding sits on each layer's core attention (hooks, so the recomputation of
                    # checkpointed core attention pads too); reverting takes it off every layer.
                    Call(f"{_IMPLEMENTATION}:start_padding", f"{_IMPLEMENTATION}:stop_padding", after=_MLA),
                ),
            ),
            Variant(
                label="native-0.18",
                requires={"megatron-core": ">=0.18,<0.20"},
                native=(
                    "MultiLatentAttention._run_core_attention pads V to the q/k head size for THD input and trims "
                    "the output (_prepare_mla_core_attention_value / _trim_mla_core_attention_output), on the "
                    "direct and the checkpointed core-attention path"
                ),
            ),
        ),
    ),
)
