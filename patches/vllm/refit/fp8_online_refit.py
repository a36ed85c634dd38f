"""vLLM's online-FP8 layers (a bf16 checkpoint quantised at load) refitted with bf16 weights, any number
of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit`` (the same calls as every format); this patch records what a refit needs
at each layer's first ``process_weights_after_loading``, with the recording pair every refit patch
installs (``_record``).

What upstream does (``vllm/model_executor/layers/quantization/online/fp8.py``, read in the 0.24.0,
0.29.0 and 0.33.0 wheels): ``Fp8PerTensorOnlineLinearMethod`` (what ``Fp8Config`` builds for a bf16
checkpoint in 0.24-0.29, and ``OnlineQuantizationConfig`` for ``linear="fp8_per_tensor"``) registers one
bf16 ``weight`` on the ``meta`` device and wraps its loader with vLLM's layerwise online processing, which
materialises the layer once every element is loaded and runs ``process_weights_after_loading``: the
weight is quantised per tensor with ``ops.scaled_fp8_quant`` (0.24: the op's dynamic mode derives the
scale, amax / 448; 0.29, 0.33: the scale is amax / 448, all-reduced over tensor-parallel ranks where the
weight is sharded along the reduced dimension, and the op's static mode quantises with it), transposed
and put in place of the bf16 parameter, and the layer is marked processed.
``Fp8PerTensorOnlineMoEMethod`` does the same per expert for ``w13_weight`` and ``w2_weight`` (one scale
per expert each) and converts them to the backend's layout. vLLM 0.24's ``Fp8Config`` builds its own
``Fp8OnlineMoEMethod`` for MoE layers instead, in another module: ``vllm.fp8_online_moe_refit``. A second
``load_weights`` then writes bf16 checkpoint tensors into the FP8 kernel tensors, or is skipped by the
processed flag.

A refit stages the bf16 parameters ``create_weights`` registered (materialised, with their loaders),
loads the bf16 weights through them, clears the processed flag (the format's row:
``_fp8_online_targets``) and re-runs upstream's processing, so the new FP8 weights and scales are what
vLLM's own load of the same bf16 weights makes: the same op, the same scale rule.

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``) reloads these layers, but
is not all-or-nothing on bad input (see ``fp8_refit.py``).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

ONLINE_FP8 = "vllm.model_executor.layers.quantization.online.fp8"
#: The recording pair every refit patch installs (``_record``, bound by ``_fp8_online_refit``), on
#: both methods of each class this format's row in ``_formats`` names.
_CREATE_WEIGHTS = "._fp8_online_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._fp8_online_refit:wrap_process_weights_after_loading"

PATCHES = (
    Patch(
        id="vllm.fp8_online_refit",
        self_check="._checks.fp8_online_refit:check_fp8_online_refit",
        summary=(
            "Online-FP8 linear and MoE layers (a bf16 checkpoint quantised per tensor at load) record their "
            "bf16 parameters so patchkit.patches.vllm.refit can refit them with bf16 weights."
        ),
        why=(
            "Fp8PerTensorOnlineLinearMethod/Fp8PerTensorOnlineMoEMethod quantise the bf16 weights once and "
            "mark the layer processed, so an RL loop's bf16 weights can no longer be loaded into it; ROLL "
            "and NeMo-RL patch vLLM's FP8 methods to take them."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.33.0/"
            "vllm/model_executor/layers/quantization/online/fp8.py"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back; re-check "
            "each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=tuple(
                    Wrap(f"{ONLINE_FP8}:{method}.{name}", target)
                    for method in ("Fp8PerTensorOnlineLinearMethod", "Fp8PerTensorOnlineMoEMethod")
                    for name, target in (("create_weights", _CREATE_WEIGHTS),
                                         ("process_weights_after_loading", _PROCESS_WEIGHTS))
                ),
                label="fp8-per-tensor-online",
            ),
        ),
    ),
)
