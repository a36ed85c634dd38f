"""vLLM fused-MoE expert parameters keep their ``weight_loader`` through processing (native, 0.24-0.33).

Declaration only (see docs/writing-patches.md). verl (``patch_vllm_moe_model_weight_loader``) and ROLL
re-attach ``mlp.experts.weight_loader`` to every ``w13_weight``/``w2_weight`` of a list of MoE model
classes after each model load, for a vLLM bug from 0.8.2: the unquantized MoE method's
``process_weights_after_loading`` registered new ``Parameter``s (padding) without the loader, so
the next ``load_weights`` (an RL weight sync) failed or fell back to the default loader. Since vLLM
0.24 ``mlp.experts`` is a ``MoERunner`` (``FusedMoE`` a factory; ``FusedMoEFactory`` from 0.25) with
no ``weight_loader``: verl's guard ``hasattr(experts, "weight_loader")`` then skips every layer
(verl #7147 guards its class-level NPU variant the same way), so the re-attachment is a silent
no-op there.

It is not needed there: in 0.24.0, 0.29.0 and 0.33.0 the expert parameters are created with the
routed-experts layer's ``weight_loader`` (``RoutedExperts.weight_loader``) and vLLM's
``replace_parameter`` (``model_executor/utils.py``), which the MoE methods use to swap processed
tensors in, carries ``weight_loader`` over (0.33: the parameter object itself is kept). Declared
``native``; the self-check builds vLLM's own fused-MoE layer (unquantized, and ModelOpt NVFP4 on the
emulation backend), loads and processes it with vLLM's code, and checks every expert parameter's
loader and a second load through them.

Outside the claim: MoE methods that swap in kernel-format tensors by plain assignment
(compressed-tensors W4A4 NVFP4/MXFP4 MoE, the b12x backend, 0.24's CPU SGL path) drop the loader,
and re-attaching it would write checkpoint-format data into kernel-format tensors: those need a
quantized refit (``patchkit.patches.vllm.refit``), not a loader.
"""

from __future__ import annotations

from patchkit import Patch, Variant

PATCHES = (
    Patch(
        id="vllm.moe_expert_weight_loaders",
        self_check="._checks.moe_expert_weight_loaders:check_moe_expert_weight_loaders",
        summary="vLLM's fused-MoE expert parameters keep the layer's weight_loader through processing (native).",
        why=(
            "RL frameworks re-attach the experts' weight_loader after every model load (vLLM 0.8.2's MoE "
            "processing dropped it); on 0.24+ their re-attachment finds no loader on mlp.experts and does nothing."
        ),
        upstream="https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/utils.py",
        removal="Nothing installed; drop the frameworks' re-attachment on vLLM >= 0.24.",
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(
                requires={"vllm": ">=0.24,<0.34"},
                native=(
                    "expert parameters are created with RoutedExperts.weight_loader and replace_parameter keeps "
                    "weight_loader when processing swaps tensors in"
                ),
            ),
        ),
    ),
)
