"""Power-of-two weight scales for vLLM's online FP8 (opt-in), as NeMo-RL quantises its FP8 weights.

Declaration only (see docs/writing-patches.md). NeMo-RL's ``pow2_weight_scaling_factors`` rounds each
FP8 weight scale up to a power of two (``ceil(log2(amax / 448))``) before it pushes the weights into
vLLM; where vLLM quantises the weights itself (online FP8: ``vllm.fp8_online_refit``), the rounding has
to happen there. vLLM has no option for it: ``online/fp8.py``'s ``_fp8_scale`` is amax / 448, and the
block-wise path calls ``per_block_cast_to_fp8(..., use_ue8m0=False)`` with the flag fixed. This patch
wraps ``_fp8_scale`` (read in the 0.29.0 and 0.33.0 wheels; 0.24 has no such function: its op derives the
scale, so it is not covered), which the per-tensor linear and MoE methods (and the per-channel ones) call
at every first load and every refit's processing, so both round alike; the weights are then quantised
by vLLM's own ``ops.scaled_fp8_quant`` at the rounded scale.

Switch it on in every vLLM process with ``PATCHKIT_OPT_IN=vllm.fp8_online_pow2_scales`` (the vLLM plugin
applies it), before the engine starts. NeMo-RL rounds per 128 x 128 block (it serves a block-wise FP8
checkpoint); online per-tensor FP8 has one scale per tensor (per expert for MoE), rounded by the same rule.
Activation scales (NeMo-RL's ``pow2_activation_scaling_factors``, a Triton kernel of vLLM's
``per_token_group_quant_fp8``) are not changed.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id="vllm.fp8_online_pow2_scales",
        summary="vLLM's online-FP8 weight scales are rounded up to powers of two (NeMo-RL's pow2 weight scales).",
        why=(
            "NeMo-RL trains and serves FP8 with power-of-two weight scales; with vLLM quantising bf16 "
            "weights itself (online FP8), the scales are amax / 448 and vLLM offers no switch."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.33.0/"
            "vllm/model_executor/layers/quantization/online/fp8.py"
        ),
        removal="When vLLM offers power-of-two (UE8M0) weight scales for online FP8.",
        opt_in=True,
        self_check="._checks.fp8_online_pow2_scales:check_fp8_online_pow2_scales",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.29,<0.34"},
                installs=(
                    Wrap(
                        "vllm.model_executor.layers.quantization.online.fp8:_fp8_scale",
                        "._fp8_online_pow2_scales:wrap_fp8_scale",
                    ),
                ),
                label="fp8-scale-pow2",
            ),
        ),
    ),
)
