"""Megatron-Bridge support for ModelOpt QAT models: quantizable layers, and export that handles them.

Declaration module (data only). Each behaviour is its own patch so it can be switched off alone;
the ranges are the Bridge releases whose sources were read and whose tests ran (0.2.0rc6, 0.3.1,
0.4.2, 0.5.1, 0.6.2; 0.4.0, 0.5.0 and 0.6.0 read from their wheels). Each ``native`` variant names
what upstream does instead, and ``tests/bridge`` shows upstream doing it. Facts:
``shared/research/upstream-drift.md`` section 4 and ``frameworks-2026-11.md``; why each is needed:
the implementation modules' docstrings.

One public helper lives here too, reached lazily (PEP 562) so this module stays cheap:
:func:`use_modelopt_layer_spec` (the fresh-QAT switch, the same call on every Bridge release).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patchkit import Call, Patch, Variant, Wrap

if TYPE_CHECKING:
    from ._modelopt_layer_spec_v03 import use_modelopt_layer_spec

__all__ = ["PATCHES", "use_modelopt_layer_spec"]


def __getattr__(name: str) -> Any:
    if name != "use_modelopt_layer_spec":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ._modelopt_layer_spec_v03 import use_modelopt_layer_spec

    globals()[name] = use_modelopt_layer_spec
    return use_modelopt_layer_spec

BRIDGE = {"megatron-bridge": "megatron.bridge"}
GPT_PROVIDER = "megatron.bridge.models.gpt_provider"
MODEL_BRIDGE = "megatron.bridge.models.conversion.model_bridge"
PARAM_MAPPING = "megatron.bridge.models.conversion.param_mapping"
BLOB = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.3.1/src/megatron/bridge/models"

V02 = {"megatron-bridge": ">=0.2.0rc0,<0.3.0rc0"}
V03 = {"megatron-bridge": ">=0.3.0rc0,<0.4.0rc0"}
V02_V03 = {"megatron-bridge": ">=0.2.0rc0,<0.4.0rc0"}
V04 = {"megatron-bridge": ">=0.4.0rc0,<0.5.0rc0"}
V040_V041 = {"megatron-bridge": ">=0.4.0rc0,<0.4.2rc0"}
V042 = {"megatron-bridge": ">=0.4.2rc0,<0.5.0rc0"}
V05 = {"megatron-bridge": ">=0.5.0rc0,<0.6.0rc0"}
V06 = {"megatron-bridge": ">=0.6.0rc0,<0.7.0rc0"}
V04_V06 = {"megatron-bridge": ">=0.4.0rc0,<0.7.0rc0"}
V05_V06 = {"megatron-bridge": ">=0.5.0rc0,<0.7.0rc0"}
#: ``provide()`` changed in 0.4, 0.5 and 0.6 (not where it reads the layer spec): one variant each,
#: the same wrap, so each release's code is fingerprinted against its own records.
_PROVIDE = Wrap(f"{GPT_PROVIDER}:GPTModelProvider.provide", "._modelopt_layer_spec_v03:wrap_provide")

PATCHES = (
    Patch(
        id="bridge.modelopt_layer_spec",
        self_check="._selfchecks:check_modelopt_layer_spec",
        summary="A GPT provider with restore_modelopt_state builds ModelOpt's quantizable layer spec.",
        why=(
            "0.2 switched default_layer_spec to quantization_layer_spec on restore_modelopt_state; 0.3 "
            "renamed it modelopt_transformer_layer_spec and dropped the switch, so QAT/restore silently "
            "gets TransformerEngine layers."
        ),
        upstream=f"{BLOB}/gpt_provider.py",
        removal=(
            "Remove when GPTModelProvider.provide dispatches on restore_modelopt_state again (0.4-0.6 do it "
            "only in the separate gpt_builder path). For fresh QAT (no state to restore) call "
            "use_modelopt_layer_spec(provider), with or without this patch."
        ),
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02,
                native="0.2 default_layer_spec returns quantization_layer_spec on restore_modelopt_state",
            ),
            Variant(requires=V03, installs=(_PROVIDE,)),
            Variant(requires=V04, installs=(_PROVIDE,)),
            Variant(requires=V05, installs=(_PROVIDE,)),
            Variant(requires=V06, installs=(_PROVIDE,)),
        ),
    ),
    Patch(
        id="bridge.quant_linear_parallelism",
        self_check="._selfchecks:check_quant_linear_parallelism",
        summary="AutoMapping knows the column/row parallelism of ModelOpt's Quant* Megatron linears.",
        why=(
            "mtq.quantize renames module classes (QuantColumnParallelLinear ...); AutoMapping detects "
            "parallelism by class name and fails with 'Cannot determine parallelism type'."
        ),
        upstream=f"{BLOB}/conversion/param_mapping.py",
        removal="Remove once AutoMapping resolves ModelOpt dynamic classes to the class they wrap.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V03,
                installs=(
                    Call(
                        "._quant_linear_parallelism:install",
                        "._quant_linear_parallelism:uninstall",
                        after=PARAM_MAPPING,
                    ),
                    Wrap(f"{PARAM_MAPPING}:AutoMapping._detect_parallelism_type",
                         "._quant_linear_parallelism:wrap_detect_parallelism_type"),
                ),
            ),
            Variant(
                requires=V04_V06,
                native=(
                    "AutoMapping._detect_parallelism_type resolves a ModelOpt dynamic module "
                    "(is_modelopt_dynamic_module) to its original class, fused-layernorm rule included; "
                    "0.5+ also lists QuantColumnParallelLinear/QuantRowParallelLinear in its registry"
                ),
            ),
        ),
    ),
    Patch(
        id="bridge.skip_quantizer_params",
        self_check="._selfchecks:check_skip_quantizer_params",
        summary="ModelOpt quantizer state (*_quantizer.*) is left out of Megatron-to-HF weight export.",
        why=(
            "Quantizer amax buffers are persistent buffers: Bridge tries to export them, warns for each, "
            "and under expert parallelism fails parsing '.weight_quantizer' as an expert number."
        ),
        upstream=f"{BLOB}/conversion/model_bridge.py",
        removal="Remove when Bridge's export filters quantizer state itself.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V03,
                installs=(Wrap(f"{MODEL_BRIDGE}:persistent_buffers", "._quantizer_params:wrap_persistent_buffers"),),
            ),
            Variant(
                # 0.4 added Bridge's own quantized export: with ENABLE_BRIDGE_QUANT_MAPPING=1 the mapping
                # registry maps *.weight_quantizer._amax / *.input_quantizer._amax, and the wrap steps aside.
                requires=V04_V06,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:persistent_buffers", "._quantizer_params:wrap_persistent_buffers_v04"),
                ),
            ),
        ),
    ),
    Patch(
        id="bridge.expert_local_to_global",
        self_check="._selfchecks:check_expert_local_to_global",
        summary="Expert names map local to global under EP for SequentialMLP (local_experts.N) too.",
        why=(
            "_megatron_local_name_to_global renumbers only grouped-GEMM names (weightN); ModelOpt's "
            "quantizable MoE is a SequentialMLP, so every EP rank would export its experts as rank 0's."
        ),
        upstream=f"{BLOB}/conversion/model_bridge.py",
        removal="Remove when _megatron_local_name_to_global handles local_experts.N.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V03,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global", "._expert_names:wrap_local_name_to_global"),
                ),
            ),
            Variant(
                requires=V040_V041,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global", "._expert_names:wrap_local_name_to_global"),
                ),
            ),
            Variant(
                # 0.4.2 reads the EP group from the model (_get_ep_group: its pg_collection, else the global
                # group); the names of both expert layouts must come from the same group.
                requires=V042,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global",
                         "._expert_names:wrap_local_name_to_global_v042"),
                ),
            ),
            Variant(
                # Forcing the wrap here would renumber twice (rank 3 of 4, 8 experts: 12, 13 for 6, 7).
                requires=V05_V06,
                native="_megatron_local_name_to_global renumbers local_experts.N on EP ranks (and leaves quantizer "
                       "state alone)",
            ),
        ),
    ),
    Patch(
        id="bridge.expert_sort_key",
        self_check="._selfchecks:check_expert_sort_key",
        summary="Export sort keys order experts numerically in both namings (local_experts.N and weightN).",
        why="extract_sort_key reads only weightN/biasN, so local_experts.10 sorts before local_experts.2.",
        upstream=f"{BLOB}/conversion/utils.py",
        removal="Remove when extract_sort_key reads local_experts.N.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V03,
                # Only the export call site in model_bridge. 0.3's peft_bridge imports the key too, for
                # adapter export (adapters are not expert-sharded). It is left alone: model_bridge imports
                # peft_bridge, so a variant targeting both would be installed as soon as peft_bridge is
                # loaded, while model_bridge is still executing and lacks the attribute.
                installs=(Wrap(f"{MODEL_BRIDGE}:extract_sort_key", "._expert_names:wrap_extract_sort_key"),),
            ),
            Variant(
                requires=V04,
                installs=(Wrap(f"{MODEL_BRIDGE}:extract_sort_key", "._expert_names:wrap_extract_sort_key"),),
            ),
            Variant(requires=V05_V06, native="extract_sort_key reads local_experts.N when there is no weightN/biasN"),
        ),
    ),
)
