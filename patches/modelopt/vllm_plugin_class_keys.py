"""ModelOpt's ``QuantModuleRegistry`` holding vLLM's ``FusedMoE`` factory function as a key.

Declaration only (see docs/writing-patches.md). ModelOpt's vLLM plugin
(``modelopt/torch/quantization/plugins/vllm.py``) registers vLLM's layers in ``QuantModuleRegistry``,
``vllm_fused_moe_layer.FusedMoE`` among them. From vLLM 0.24 ``FusedMoE`` is a factory function, not
a module class, and the registry answers every lookup with ``issubclass(<module class>, <key>)`` over
its keys (``_DMRegistryCls._get_registered_nn_class``, ``modelopt/torch/opt/dynamic.py``): once the
plugin is imported, any lookup that reaches the function raises ``TypeError: issubclass() arg 2 must
be a class``, so ``mtq.quantize`` fails on any model with a module ModelOpt does not register first (an
activation, a norm). NeMo-RL drops the non-class keys after the plugin is imported
(``vllm_quant_patch.py``, ``_drop_nonclass_quant_registry_keys``); the patch does the same.

What is dropped is a registration that could never match a module: vLLM's MoE layers are not fake-quantized
either way on these releases (the patch logs what it drops).

Ranges, from the wheels: ModelOpt 0.44.0 and 0.45.0 register ``FusedMoE`` unconditionally; on vLLM
0.24-0.26 ``layer.py`` defines it as a function (patched; tested on ModelOpt 0.45.0 with vLLM 0.24.0). From
vLLM 0.27 ``layer.py`` has no ``FusedMoE`` and those plugins fail to import (no registry key to drop: not
covered). ModelOpt 0.46.0 to 0.48 register a layer only when it is a module class (``_is_module_cls``):
native, tested on 0.47.0 with vLLM 0.29.0. ModelOpt 0.43's plugin imports ``vllm.attention``, which
vLLM 0.24+ do not have: it never registers anything there.
"""

from __future__ import annotations

from patchkit import Call, Patch, Variant

MODELOPT_VLLM_PLUGIN = "modelopt.torch.quantization.plugins.vllm"

PATCHES = (
    Patch(
        id="modelopt.vllm_plugin_class_keys",
        self_check="._checks.vllm_plugin_class_keys:check_vllm_plugin_class_keys",
        summary=(
            "ModelOpt's QuantModuleRegistry drops the keys its vLLM plugin registered that are not classes "
            "(vLLM's FusedMoE factory), so registry lookups and mtq.quantize stop raising TypeError."
        ),
        why=(
            "ModelOpt 0.44-0.45's vLLM plugin registers vllm FusedMoE, a function from vLLM 0.24; every "
            "registry lookup runs issubclass over the keys and raises TypeError on it (NeMo-RL drops such keys)."
        ),
        upstream="https://github.com/NVIDIA/Model-Optimizer/blob/0.46.0/modelopt/torch/quantization/plugins/vllm.py",
        removal="Drop with ModelOpt 0.45: from 0.46 the plugin registers module classes only (native).",
        version_modules={"nvidia-modelopt": "modelopt", "vllm": "vllm"},
        variants=(
            Variant(
                requires={"nvidia-modelopt": ">=0.44,<0.46", "vllm": ">=0.24,<0.27"},
                installs=(
                    Call(
                        "._vllm_plugin_class_keys:drop_non_class_keys",
                        "._vllm_plugin_class_keys:restore_dropped_keys",
                        after=MODELOPT_VLLM_PLUGIN,
                    ),
                ),
                label="drop-non-class-keys",
            ),
            Variant(
                requires={"nvidia-modelopt": ">=0.46,<0.49", "vllm": ">=0.24,<0.34"},
                native="ModelOpt's vLLM plugin registers a vLLM layer only when it is a module class (_is_module_cls)",
            ),
        ),
    ),
)
