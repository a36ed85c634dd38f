"""vLLM ModelOpt MXFP8 linear and fused-MoE layers that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit`` (the same calls as for ModelOpt NVFP4 and FP8); this patch records
what a refit needs at each layer's first ``process_weights_after_loading`` (``_record``, with
the format's hook ``_mxfp8_targets.allow_reprocessing``).

What upstream does (``vllm/model_executor/layers/quantization/modelopt.py``, read in the 0.24.0,
0.29.0 and 0.33.0 wheels and the 0.16.0-0.33.0 sources patchkit's static check keeps):

- ``ModelOptMxFp8LinearMethod`` (0.16-0.29; from 0.30 MXFP8 linear layers use the generic
  ``ModelOptLinearMethod``, which ``vllm.nvfp4_refit`` records): an E4M3 ``weight`` [N, K] and a uint8
  E8M0 ``weight_scale`` [N, K/32]. Processing hands them to the selected MXFP8 linear kernel, which
  replaces both parameters (plain ``Parameter``s, no ``weight_loader``); the emulation kernel
  dequantises the weight to bf16 at load and then skips processing for any bf16 weight, so a second
  ``load_weights`` writes raw E4M3 values into the bf16 weight and serves them unscaled.
- ``ModelOptMxFp8FusedMoE`` (0.18-0.33): E4M3 ``w13_weight``/``w2_weight`` and E8M0
  ``w13_weight_scale``/``w2_weight_scale``; processing converts them to the backend's layout
  (EMULATION: bf16 weights) and sets ``_already_called_process_weights_after_loading`` on the layer,
  after which it does nothing: a second load is never converted.

Refits are proven on vLLM's emulation paths (CPU; ``_checks/_mxfp8``): the other backends' processing
needs their GPU libraries. A refit checks every new kernel tensor's shape and dtype against the one in
use before it copies anything.

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``, vLLM #32133) is not
all-or-nothing on bad input (tests/vllm/test_mxfp8_refit.py pins what it does on MXFP8).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

MODELOPT = "vllm.model_executor.layers.quantization.modelopt"
#: The recording pair every refit patch installs (``_record``, bound by ``_mxfp8_refit``).
_CREATE_WEIGHTS = "._mxfp8_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._mxfp8_refit:wrap_process_weights_after_loading"

_LINEAR = (
    Wrap(f"{MODELOPT}:ModelOptMxFp8LinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptMxFp8LinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)
_MOE = (
    Wrap(f"{MODELOPT}:ModelOptMxFp8FusedMoE.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptMxFp8FusedMoE.process_weights_after_loading", _PROCESS_WEIGHTS),
)

PATCHES = (
    Patch(
        id="vllm.mxfp8_refit",
        self_check="._checks.mxfp8_refit:check_mxfp8_refit",
        summary=(
            "ModelOpt MXFP8 linear (vLLM 0.24-0.29) and fused-MoE layers record their checkpoint parameters "
            "so patchkit.patches.vllm.refit can reload them into the same kernel tensors."
        ),
        why=(
            "ModelOptMxFp8LinearMethod/ModelOptMxFp8FusedMoE.process_weights_after_loading replace the "
            "checkpoint parameters with the kernel's (emulation: bf16) and the MoE method runs only once "
            "per layer, so an RL loop's second load_weights serves unscaled or unconverted weights; NeMo-RL "
            "patches both methods for this, and vLLM's own layerwise reload is not all-or-nothing on bad input."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/"
            "vllm/model_executor/layers/quantization/modelopt.py; vllm-project/vllm#32133"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back "
            "(tests/vllm/test_mxfp8_refit.py::test_native_reload_* says when); re-check each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.30"},
                installs=(*_LINEAR, *_MOE),
                label="modelopt-mxfp8-linear-moe",
            ),
            Variant(
                requires={"vllm": ">=0.30,<0.34"},
                installs=_MOE,
                label="modelopt-mxfp8-moe",
            ),
        ),
    ),
)
