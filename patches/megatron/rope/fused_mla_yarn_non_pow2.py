"""MLA's fused YaRN RoPE for key and value with a no-RoPE key width that is not a power of two
(megatron-core 0.14-0.19).

Declaration module. With ``apply_rope_fusion`` and YaRN RoPE, ``MLASelfAttention`` splits ``kv`` and
applies RoPE to the key through ``fused_apply_mla_rope_for_kv``, whose Triton kernels
(``rotary_fwd_kv_kernel``, ``rotary_bwd_kv_kernel`` in ``megatron/core/fusions/
fused_mla_yarn_rope_apply.py``) build ``tl.arange(0, k_dim)`` over ``qk_head_dim``: Triton refuses a
range that is not a power of two, so a model whose ``qk_head_dim`` is 192 cannot train with the fusion
(slime patches the kernels: ``docker/patch/latest/megatron.patch``; inventory row S5). The kernels
also mask heads by their offset inside a block, which lets a block reach heads past ``head_num`` when
it is not a multiple of the autotuned block. The patch puts kernels with slime's fix in place
(``._fused_mla_yarn_non_pow2``): the key read over the next power of two, masked to ``k_dim``; heads
masked by their index in the tensor; a ``v_dim`` of 0 allowed.

Ranges, read in the wheels 0.14.0, 0.15.3, 0.16.1, 0.17.1, 0.18.2 and 0.19.2: the KV kernels and
``ApplyMLARotaryEmbKV`` are the same code in all of them (0.14 and 0.15 only add an
``experimental_fn`` decorator to the public functions), and Megatron-LM main d98e8a6 (0.20.0, not
released) still builds ``tl.arange(0, k_dim)``.
"""

from __future__ import annotations

from patchkit import Patch, Replace, Variant

from .._constants import MEGATRON_CORE

_FUSED_MLA_ROPE = "megatron.core.fusions.fused_mla_yarn_rope_apply"

PATCHES = (
    Patch(
        id="megatron.fused_mla_yarn_non_pow2",
        self_check="._checks.fused_mla_yarn_non_pow2:check_fused_mla_yarn_non_pow2",
        summary=(
            "MLA's fused YaRN RoPE for key and value (apply_rope_fusion) runs with a qk_head_dim that is not "
            "a power of two (192) and any head count, equal to megatron-core's unfused RoPE."
        ),
        why=(
            "The Triton KV kernels build tl.arange(0, k_dim), which Triton refuses unless k_dim is a power of "
            "two, and mask heads by their offset inside a block; slime patches megatron-core's source for it."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.2/megatron/core/fusions/"
            "fused_mla_yarn_rope_apply.py (rotary_fwd_kv_kernel, rotary_bwd_kv_kernel: tl.arange(0, k_dim))"
        ),
        removal=(
            "Remove once the KV kernels read the key over a power-of-two range masked to k_dim: unchanged in "
            "0.14.0-0.19.2 and on Megatron-LM main d98e8a6."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="masked-kv-kernels",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Replace(f"{_FUSED_MLA_ROPE}:ApplyMLARotaryEmbKV",
                            "._fused_mla_yarn_non_pow2:ApplyMLARotaryEmbKV"),
                ),
            ),
        ),
    ),
)
