"""vLLM compressed-tensors NVFP4 fused-MoE layers that can be refitted in place, any number of times.

Declaration only (see docs/writing-patches.md). The refit is driven through
``patchkit.patches.vllm.refit``; this patch records what a refit needs at each
``CompressedTensorsW4A4Nvfp4MoEMethod`` layer's first ``process_weights_after_loading``, with the
recording wraps every refit patch shares (``_record``).

Upstream (``compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py``, read in
the 0.24.0, 0.29.0 and 0.33.0 wheels): ``create_weights`` registers ``w13/w2_weight_packed`` and their
scales (block, global, input global); processing renames them, keeps one global scale per expert and
converts everything to the selected backend's layout. A second ``load_weights`` finds no
``weight_packed``.

A patch of its own, apart from the linear layers' ``vllm.compressed_tensors_nvfp4_refit``: vLLM imports
this module only when it builds an NVFP4 MoE layer, and a patch installs once every module it targets
is imported; a dense model's linear layers must not wait for it.

0.24-0.28 also get a wrap of the method's ``__init__`` that keeps ``use_a16`` on the method, as 0.29+ do
(``_compressed_tensors_nvfp4_moe_refit``): without it a refit of an NVFP4A16 MoE layer demanded the input global scales
such a checkpoint does not carry (found on an H100 with vLLM 0.24.0's Marlin kernels).

No range is declared ``native``: vLLM's layerwise reload (``reload_weights``, vLLM #32133, in 0.29 and
0.33) is not all-or-nothing on bad input.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

CT_MOE_NVFP4 = (
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a4_nvfp4"
)
#: The recording pair every refit patch installs (``_record``, bound by
#: ``_compressed_tensors_nvfp4_moe_refit``).
_IMPL = "._compressed_tensors_nvfp4_moe_refit"

_MOE = (
    Wrap(f"{CT_MOE_NVFP4}:CompressedTensorsW4A4Nvfp4MoEMethod.create_weights", f"{_IMPL}:wrap_create_weights"),
    Wrap(f"{CT_MOE_NVFP4}:CompressedTensorsW4A4Nvfp4MoEMethod.process_weights_after_loading",
         f"{_IMPL}:wrap_process_weights_after_loading"),
)

PATCHES = (
    Patch(
        id="vllm.compressed_tensors_nvfp4_moe_refit",
        self_check="._checks.compressed_tensors_nvfp4_refit:check_compressed_tensors_nvfp4_moe_refit",
        summary=(
            "compressed-tensors NVFP4 fused-MoE layers record their checkpoint parameters so "
            "patchkit.patches.vllm.refit can reload them into the same kernel tensors."
        ),
        why=(
            "CompressedTensorsW4A4Nvfp4MoEMethod renames w13/w2_weight_packed, keeps one global scale "
            "per expert and converts to the backend's layout in process_weights_after_loading, so an RL "
            "loop's second load_weights fails; verl and slime patch this method."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.29.0/vllm/model_executor/layers/quantization/"
            "compressed_tensors/compressed_tensors_moe/compressed_tensors_moe_w4a4_nvfp4.py"
        ),
        removal=(
            "Declare native once vLLM's reload_weights validates refit tensors and rolls back; "
            "re-check each release."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                # 0.24-0.28 forget the method's use_a16, which tells a refit that an NVFP4A16 layer's
                # input global scales are placeholders its checkpoint does not carry.
                requires={"vllm": ">=0.24,<0.29"},
                installs=(
                    *_MOE,
                    Wrap(f"{CT_MOE_NVFP4}:CompressedTensorsW4A4Nvfp4MoEMethod.__init__",
                         f"{_IMPL}:wrap_init"),
                ),
                label="ct-nvfp4-moe-keep-a16",
            ),
            Variant(requires={"vllm": ">=0.29,<0.34"}, installs=_MOE, label="ct-nvfp4-moe"),
        ),
    ),
)
