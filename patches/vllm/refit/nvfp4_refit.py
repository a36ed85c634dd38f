"""vLLM ModelOpt NVFP4 layers that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit itself is driven through
``patchkit.patches.vllm.refit``; this patch records what a refit needs at each layer's first
``process_weights_after_loading``.

Ranges, from research/upstream-drift.md section 2 (vLLM sdists 0.10.2-0.33.0):
- 0.12-0.20: ``ModelOptNvFp4LinearMethod`` + ``ModelOptNvFp4FusedMoE``. Checkpoint scale names
  (``input_scale``/``weight_scale_2``) are renamed and deleted from 0.16, and the kernel
  abstraction arrives in 0.20; the recording is agnostic to both (it records whatever
  ``create_weights`` registered and whatever processing produced), so one variant covers them.
- 0.21-0.29: ``ModelOptNvFp4W4A16LinearMethod`` (W4A16, Marlin) joins.
- 0.30-0.33: the per-format linear methods are gone; NVFP4 linear layers use the generic
  ``ModelOptLinearMethod`` (it also serves the other ModelOpt formats, which the same refit handles).

No range is declared ``native``: vLLM's layerwise reload (0.16+) reloads good weights correctly,
but on vLLM 0.29 a refit tensor of the wrong shape leaves the layer's parameters on the meta
device (an empty ``AssertionError``; the layer can no longer run), and a missing parameter is
processed from uninitialised memory without an error (tests/vllm/test_native_reload_gaps.py).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

MODELOPT = "vllm.model_executor.layers.quantization.modelopt"
#: The recording pair every refit patch installs (``_record``, bound by ``_nvfp4_refit``): one
#: pair per method class, the first counting what ``create_weights`` registered, the second recording
#: at the first processing.
_CREATE_WEIGHTS = "._nvfp4_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._nvfp4_refit:wrap_process_weights_after_loading"

_LINEAR_W4A4 = (
    Wrap(f"{MODELOPT}:ModelOptNvFp4LinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptNvFp4LinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)
_LINEAR_W4A16 = (
    Wrap(f"{MODELOPT}:ModelOptNvFp4W4A16LinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptNvFp4W4A16LinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)
_LINEAR_GENERIC = (
    Wrap(f"{MODELOPT}:ModelOptLinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptLinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)
_MOE = (
    Wrap(f"{MODELOPT}:ModelOptNvFp4FusedMoE.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{MODELOPT}:ModelOptNvFp4FusedMoE.process_weights_after_loading", _PROCESS_WEIGHTS),
)

PATCHES = (
    Patch(
        id="vllm.nvfp4_refit",
        self_check="._checks.nvfp4_refit:check_nvfp4_refit",
        summary=(
            "ModelOpt NVFP4 linear and MoE layers record their checkpoint parameters so "
            "patchkit.patches.vllm.refit can reload them into the same kernel tensors."
        ),
        why=(
            "process_weights_after_loading replaces Parameters (dropping weight_loader) and deletes "
            "checkpoint scales, so an RL loop's second load_weights fails or is wrong; vLLM's own "
            "layerwise reload (0.16+) is not safe on bad input (breaks or silently corrupts the layer)."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/"
            "vllm/model_executor/layers/quantization/modelopt.py"
        ),
        removal=(
            "Declare native once vLLM's layerwise reload validates refit tensors and rolls back "
            "(not the case in 0.29); re-check on each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.12,<0.21"},
                installs=(*_LINEAR_W4A4, *_MOE),
                label="modelopt-nvfp4-linear",
            ),
            Variant(
                requires={"vllm": ">=0.21,<0.30"},
                installs=(*_LINEAR_W4A4, *_LINEAR_W4A16, *_MOE),
                label="modelopt-nvfp4-linear-w4a16",
            ),
            Variant(
                requires={"vllm": ">=0.30,<0.34"},
                installs=(*_LINEAR_GENERIC, *_MOE),
                label="modelopt-linear-method",
            ),
        ),
    ),
)
