"""vLLM FP8 linear and fused-MoE layers that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit`` (the same calls as for ModelOpt NVFP4); this patch records what a
refit needs at each layer's first ``process_weights_after_loading``, with the same recording wraps
as ``vllm.nvfp4_refit`` (``_record``: they keep whatever ``create_weights`` registered
and whatever processing produced, whatever the format).

What upstream does (``vllm/model_executor/layers/quantization/fp8.py``, read in the 0.24.0, 0.29.0 and
0.33.0 wheels; the classes, their ``create_weights`` parameters and the processing steps are the same
in the three):

- ``Fp8LinearMethod`` (an FP8-serialised checkpoint): per-tensor ``weight``/``weight_scale`` (one
  scale per fused shard) and, with static activations, ``input_scale``; block-wise ``weight`` and
  ``weight_scale_inv`` (one scale per 128 x 128 block). Processing requantises fused shards to their
  largest scale, transposes the weight and replaces the parameters (0.24, 0.29: plain ``Parameter``s
  without ``weight_loader``; 0.33 keeps the objects but rebinds their data to the transposed
  kernel layout), so a second ``load_weights`` writes checkpoint-layout tensors into kernel-layout
  storage: it fails on a shape check, or, for a square weight, silently serves the transpose.
- ``Fp8MoEMethod``: ``w13_weight``/``w2_weight`` with per-expert (``w13`` per shard) or block scales
  and, with static activations, per-expert input scales; processing requantises ``w13`` to one scale
  per expert, takes the largest input scale and converts to the backend's layout.

Online FP8 (a bf16 checkpoint quantised at load: ``Fp8PerTensorOnlineLinearMethod``,
``Fp8PerTensorOnlineMoEMethod``, 0.24's ``Fp8OnlineMoEMethod``) is another format: its refits push bf16
weights, and those classes do not run these methods; ``vllm.fp8_online_refit`` and
``vllm.fp8_online_moe_refit`` record them.

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``, vLLM #32133; present
in 0.29 and 0.33) reloads FP8 layers, but it is not all-or-nothing on bad input
(tests/vllm/test_fp8_refit.py pins what it does).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

FP8 = "vllm.model_executor.layers.quantization.fp8"
#: The recording pair every refit patch installs (``_record``, bound by ``_fp8_refit``), on
#: both methods of each class this format's row in ``_formats`` names.
_CREATE_WEIGHTS = "._fp8_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._fp8_refit:wrap_process_weights_after_loading"

_LINEAR = (
    Wrap(f"{FP8}:Fp8LinearMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{FP8}:Fp8LinearMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)
_MOE = (
    Wrap(f"{FP8}:Fp8MoEMethod.create_weights", _CREATE_WEIGHTS),
    Wrap(f"{FP8}:Fp8MoEMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
)

PATCHES = (
    Patch(
        id="vllm.fp8_refit",
        self_check="._checks.fp8_refit:check_fp8_refit",
        summary=(
            "FP8 linear and MoE layers (per-tensor and block-wise) record their checkpoint parameters "
            "so patchkit.patches.vllm.refit can reload them into the same kernel tensors."
        ),
        why=(
            "Fp8LinearMethod/Fp8MoEMethod.process_weights_after_loading requantise, transpose and "
            "replace the checkpoint parameters, so an RL loop's second load_weights fails or serves "
            "wrong weights; verl, NeMo-RL and ROLL each patch these methods, and vLLM's own "
            "layerwise reload is not all-or-nothing on bad input."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/"
            "vllm/model_executor/layers/quantization/fp8.py; vllm-project/vllm#28425 (open), #32133"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back "
            "(tests/vllm/test_fp8_refit.py::test_native_reload_* says when); re-check each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(*_LINEAR, *_MOE),
                label="fp8-linear-moe",
            ),
        ),
    ),
)
