"""vLLM 0.24's online-FP8 fused-MoE layers under ``Fp8Config`` (a bf16 checkpoint quantised at load)
refitted with bf16 weights, any number of times.

Declaration only (see docs/writing-patches.md); the same format as ``vllm.fp8_online_refit``, whose
docstring tells the story. vLLM 0.24's ``Fp8Config`` builds, for the MoE layers of a bf16 checkpoint,
``Fp8OnlineMoEMethod`` (``quantization/fp8.py``, a subclass of ``Fp8MoEMethod`` that overrides both
methods; read in the 0.24.0 wheel, gone by 0.29): bf16 ``w13_weight``/``w2_weight`` on the ``meta``
device, quantised per expert by ``ops.scaled_fp8_quant`` (dynamic: scale = amax / 448) once the layer
is loaded, then marked processed.

A patch of its own, apart from ``vllm.fp8_online_refit``: vLLM 0.24 imports ``quantization/fp8.py`` and
``quantization/online/fp8.py`` apart (a MoE-only model under ``Fp8Config`` never imports the latter), and
a patch installs once every module it targets is imported. Declared for 0.24 only, the release it was
read and run in.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

FP8 = "vllm.model_executor.layers.quantization.fp8"
#: The recording pair every refit patch installs (``_record``, bound by ``_fp8_online_moe_refit``).
_CREATE_WEIGHTS = "._fp8_online_moe_refit:wrap_create_weights"
_PROCESS_WEIGHTS = "._fp8_online_moe_refit:wrap_process_weights_after_loading"

PATCHES = (
    Patch(
        id="vllm.fp8_online_moe_refit",
        self_check="._checks.fp8_online_refit:check_fp8_online_moe_refit",
        summary=(
            "vLLM 0.24's online-FP8 fused-MoE layers (Fp8OnlineMoEMethod, a bf16 checkpoint under Fp8Config) "
            "record their bf16 parameters so patchkit.patches.vllm.refit can refit them with bf16 weights."
        ),
        why=(
            "Fp8OnlineMoEMethod quantises the bf16 expert weights once and marks the layer processed, so an "
            "RL loop's bf16 weights can no longer be loaded into it; ROLL patches vLLM's FP8 MoE method to "
            "take them."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.24.0/vllm/model_executor/layers/quantization/fp8.py",
        removal="Drop when vLLM 0.24 leaves the supported range (later releases build Fp8PerTensorOnlineMoEMethod).",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.25"},
                installs=(
                    Wrap(f"{FP8}:Fp8OnlineMoEMethod.create_weights", _CREATE_WEIGHTS),
                    Wrap(f"{FP8}:Fp8OnlineMoEMethod.process_weights_after_loading", _PROCESS_WEIGHTS),
                ),
                label="fp8-online-moe",
            ),
        ),
    ),
)
