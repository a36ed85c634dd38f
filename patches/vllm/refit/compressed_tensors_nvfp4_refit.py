"""vLLM compressed-tensors NVFP4 linear layers that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit`` (the same calls as for ModelOpt NVFP4 and FP8); this patch records
what a refit needs at each layer's first ``process_weights_after_loading``, with the recording wraps
of ``vllm.nvfp4_refit`` (``_record``: they keep whatever ``create_weights`` registered and
whatever processing produced, whatever the format).

What upstream does (``vllm/model_executor/layers/quantization/compressed_tensors/``, read in the 0.24.0,
0.29.0 and 0.33.0 wheels; the classes, their parameters and processing steps are the same in the three,
0.33 replaces through ``replace_parameter`` where 0.24/0.29 assign new ``Parameter`` objects):

- Linear layers of an ``nvfp4-pack-quantized`` checkpoint get ``CompressedTensorsLinearMethod``, which
  delegates to the scheme vLLM put on ``layer.scheme``: ``CompressedTensorsW4A4Fp4`` for NVFP4 (W4A4) and,
  with ``use_a16=True``, for NVFP4A16 (W4A16; the separate ``CompressedTensorsW4A16Fp4`` of older releases
  is gone by 0.24). ``create_weights`` registers ``weight_packed``/``weight_scale``/``weight_global_scale``
  (and ``input_global_scale`` for W4A4); processing renames ``weight_packed`` to ``weight``, replaces the
  global scales with their reciprocals (one per fused layer), adds ``alpha``/``input_global_scale_inv``
  and hands the layer to the NVFP4 linear kernel (Marlin repacks W4A16 to int32). A second
  ``load_weights`` finds no ``weight_packed`` and scalar scales without a ``weight_loader``.
- ``CompressedTensorsW4A4Nvfp4MoEMethod`` (fused MoE, W4A4 and W4A16): ``w13/w2_weight_packed`` and
  their scales; processing renames them, keeps one global scale per expert and converts everything to the
  selected backend's layout.

The linear method is generic (every compressed-tensors scheme goes through it), so its wraps record a
layer only when its scheme is the NVFP4 one (the format's row in ``_formats`` names the scheme);
a layer of any other scheme passes straight through, unrecorded, and a refit refuses it
(``UnsupportedQuantizationError``).
verl (V24, ``verl/utils/qat/vllm_patch.py``) and slime (S22) patch these three methods for the same reason.

The fused-MoE method is ``vllm.compressed_tensors_nvfp4_moe_refit``'s: vLLM imports its module only
when it builds an NVFP4 MoE layer, and a patch waits until every module it targets is imported, so a
dense model's linear layers would never be recorded if one patch targeted both.

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``, vLLM #32133, in 0.29 and
0.33) is not all-or-nothing on bad input (``tests/vllm/test_fp8_refit.py`` and
``test_native_reload_gaps.py`` pin what it does on the same machinery).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

CT = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors"
#: The recording pair every refit patch installs (``_record``, bound by
#: ``_compressed_tensors_nvfp4_refit``); the format table takes a layer by its scheme.
_CREATE_WEIGHTS = "._compressed_tensors_nvfp4_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._compressed_tensors_nvfp4_refit:wrap_process_weights_after_loading"

_LINEAR = (
    Wrap(f"{CT}:CompressedTensorsLinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{CT}:CompressedTensorsLinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)

PATCHES = (
    Patch(
        id="vllm.compressed_tensors_nvfp4_refit",
        self_check="._checks.compressed_tensors_nvfp4_refit:check_compressed_tensors_nvfp4_refit",
        summary=(
            "compressed-tensors NVFP4 linear layers (W4A4, W4A16) record their checkpoint "
            "parameters so patchkit.patches.vllm.refit can reload them into the same kernel tensors."
        ),
        why=(
            "CompressedTensorsW4A4Fp4 (linear, W4A4 and use_a16) renames weight_packed, replaces the "
            "global scales and converts to kernel layout in process_weights_after_loading, so an RL "
            "loop's second load_weights fails; verl and slime patch these methods, and vLLM's own "
            "layerwise reload is not all-or-nothing on bad input."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/vllm/model_executor/layers/quantization/"
            "compressed_tensors/schemes/compressed_tensors_w4a4_nvfp4.py; vllm-project/vllm#32133"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back; "
            "re-check each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(requires={"vllm": ">=0.24,<0.34"}, installs=_LINEAR, label="ct-nvfp4-linear"),
        ),
    ),
)
