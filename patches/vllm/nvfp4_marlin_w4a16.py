"""Serve ModelOpt NVFP4 checkpoints as W4A16 through vLLM's Marlin kernels (opt-in), as verl does.

Declaration only (see docs/writing-patches.md). verl forces vLLM's Marlin backend for NVFP4 dense
and MoE layers so that rollouts use W4A16 semantics (FP4 weights, 16-bit activations: what NVFP4
W4A16 QAT trained) even on GPUs whose W4A4 kernels would quantize activations too. vLLM has this
mode itself for checkpoints whose ``quant_algo`` is ``W4A16_NVFP4`` (0.21+:
``ModelOptNvFp4W4A16LinearMethod`` with Marlin pinned, and ``ModelOptNvFp4FusedMoE.use_a16``, where
only Marlin accepts a missing activation scheme; 0.30+: the generic ``ModelOptLinearMethod`` with no
activation scheme). This patch makes an ``NVFP4`` (W4A4) checkpoint take that same path: the
config's ``quant_method`` ``"NVFP4"`` becomes ``"W4A16_NVFP4"`` before vLLM picks any method or
kernel. Checkpoint input scales are then unread placeholders (loaded, then dropped, by vLLM).

Switch it on in every vLLM process with ``PATCHKIT_OPT_IN=vllm.nvfp4_marlin_w4a16`` (the vLLM plugin
applies it), before the engine starts. Marlin is CUDA-only (compute capability 7.5+); elsewhere
vLLM's kernel selection fails at model construction with its own error.

Ranges: written against vLLM 0.24 and 0.33 (both run on CPU with Marlin's CUDA repack stood in;
see docs/vllm-refit.md); 0.25-0.32 are inside the range unrun.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id="vllm.nvfp4_marlin_w4a16",
        summary="ModelOpt NVFP4 checkpoints are served as W4A16 (FP4 weights, 16-bit activations) on Marlin.",
        why=(
            "RL frameworks train NVFP4 W4A16 QAT and want rollouts with the same semantics; vLLM serves "
            "an NVFP4 checkpoint as W4A4 (activations quantized) wherever a W4A4 kernel exists."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.33.0/"
            "vllm/model_executor/layers/quantization/modelopt.py"
        ),
        removal="When vLLM offers a per-engine switch that serves NVFP4 checkpoints as W4A16.",
        opt_in=True,
        self_check="._checks.nvfp4_marlin_w4a16:check_nvfp4_marlin_w4a16",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(
                    Wrap(
                        "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4Config.__init__",
                        "._nvfp4_marlin_w4a16:wrap_config_init",
                    ),
                ),
                label="quant-method-w4a16",
            ),
        ),
    ),
)
