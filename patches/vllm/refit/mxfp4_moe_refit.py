"""vLLM MXFP4 fused-MoE layers (gpt-oss style checkpoints) that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit`` (the same calls as for ModelOpt NVFP4 and FP8); this patch records
what a refit needs at each layer's first ``process_weights_after_loading`` (``_record``, with
the format's hooks in ``_mxfp4_targets``).

What upstream does (``vllm/model_executor/layers/quantization/mxfp4.py`` and
``fused_moe/oracle/mxfp4.py``, read in the 0.24.0, 0.29.0 and 0.33.0 wheels): ``GptOssMxfp4MoEMethod``
(gpt-oss checkpoints; on 0.24 also every ``mxfp4`` one) and ``Mxfp4MoEMethod`` (0.29+, the canonical
``mxfp4`` method) register uint8 ``w13_weight``/``w2_weight`` (two E2M1 values a byte), uint8 E8M0
``w13_weight_scale``/``w2_weight_scale`` (one per 32 values) and, for gpt-oss, bf16 biases.
Processing converts them to the selected backend's layout; on MARLIN the weights become int32 Marlin
tiles and the scales permuted E8M0 of another shape, so a second ``load_weights`` fails on the shapes.

Covered: the MARLIN backend, padded or not, and the TRITON backend (triton_kernels' fused MoE: what vLLM
picks for gpt-oss on Hopper). vLLM pads for Marlin (hidden size to 256, per-rank
intermediate size to 128: gpt-oss-20b/120b's 2880/2880 become 3072/2944, the same in 0.24, 0.29 and
0.33), zero-fills the padded parameters and loads the checkpoint into part of them; a refit stages
zeros of the padded shape and demands the checkpoint's part (``_mxfp4_targets.checkpoint_shapes``).
With tensor parallelism a rank is demanded the slice its loader gives it: gpt-oss's model loader
slices in whole 32-wide blocks (at TP 4: 736, 736, 736 and 672 rows, not the configured 720).
On TRITON processing swizzles weights and scales into triton_kernels tensors kept off the layer's
parameters (the weights as layer attributes, the scales in the method's precision configs); a refit
copies the re-processed storage into those (``_mxfp4_targets.served_tensors``), so the kernel keeps
every object and address. Refused by name, before any write (``UnsupportedQuantizationError``): every
other backend (``_mxfp4_targets`` says why: FlashInfer's SM90 MXFP4 x BF16 kernel and the rest could not
be run here).

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``, vLLM #32133) is not
all-or-nothing on bad input (tests/vllm/test_mxfp4_moe_refit.py pins what it does on MXFP4).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

MXFP4 = "vllm.model_executor.layers.quantization.mxfp4"
#: The recording pair every refit patch installs (``_record``, bound by ``_mxfp4_moe_refit``).
_RECORD = "._mxfp4_moe_refit"

PATCHES = (
    Patch(
        id="vllm.mxfp4_moe_refit",
        self_check="._checks.mxfp4_moe_refit:check_mxfp4_moe_refit",
        summary=(
            "MXFP4 fused-MoE layers (gpt-oss; MARLIN backend, padded sizes included, and TRITON, gpt-oss's "
            "backend on Hopper) record their checkpoint parameters so patchkit.patches.vllm.refit can reload "
            "them into the same kernel tensors."
        ),
        why=(
            "GptOssMxfp4MoEMethod/Mxfp4MoEMethod.process_weights_after_loading convert the checkpoint "
            "tensors to the backend's layout (Marlin tiles, permuted scales; gpt-oss's hidden size 2880 "
            "padded to 3072; on Triton, swizzled triton_kernels tensors off the layer's parameters), so an "
            "RL loop's second load_weights fails; verl patches vLLM's mxfp4 replace_parameter for this "
            "(verl #7149), and vLLM's own layerwise reload is not all-or-nothing on bad input."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/"
            "vllm/model_executor/layers/quantization/mxfp4.py; vllm-project/vllm#32133"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back "
            "(tests/vllm/test_mxfp4_moe_refit.py::test_native_reload_* says when); re-check each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                installs=(
                    Wrap(f"{MXFP4}:GptOssMxfp4MoEMethod.create_weights", f"{_RECORD}:wrap_create_weights"),
                    Wrap(f"{MXFP4}:GptOssMxfp4MoEMethod.process_weights_after_loading",
                         f"{_RECORD}:wrap_process_weights_after_loading"),
                    Wrap(f"{MXFP4}:Mxfp4MoEMethod.create_weights", f"{_RECORD}:wrap_create_weights"),
                    Wrap(f"{MXFP4}:Mxfp4MoEMethod.process_weights_after_loading",
                         f"{_RECORD}:wrap_process_weights_after_loading"),
                ),
                label="mxfp4-moe-marlin",
            ),
        ),
    ),
)
