"""``bridge.modelopt_layer_spec``: A GPT provider with restore_modelopt_state builds ModelOpt's quantizable
layer spec.

Declaration only (data); the code lives in the implementation modules.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

BRIDGE = {"megatron-bridge": "megatron.bridge"}
GPT_PROVIDER = "megatron.bridge.models.gpt_provider"
BLOB = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.3.1/src/megatron/bridge/models"
V02 = {"megatron-bridge": ">=0.2.0rc0,<0.3.0rc0"}
V03 = {"megatron-bridge": ">=0.3.0rc0,<0.4.0rc0"}
V04 = {"megatron-bridge": ">=0.4.0rc0,<0.5.0rc0"}
V05 = {"megatron-bridge": ">=0.5.0rc0,<0.6.0rc0"}
V06 = {"megatron-bridge": ">=0.6.0rc0,<0.7.0rc0"}
#: ``provide()`` changed in 0.4, 0.5 and 0.6 (not where it reads the layer spec): one variant each,
#: the same wrap, so each release's code is fingerprinted against its own records.
_PROVIDE = Wrap(f"{GPT_PROVIDER}:GPTModelProvider.provide", "._modelopt_layer_spec:wrap_provide")

PATCHES = (
    Patch(
        id="bridge.modelopt_layer_spec",
        self_check="._checks.modelopt_layer_spec:check_modelopt_layer_spec",
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
)
