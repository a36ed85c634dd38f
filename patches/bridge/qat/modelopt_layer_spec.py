"""``bridge.modelopt_layer_spec``: A GPT provider with restore_modelopt_state builds ModelOpt's quantizable
layer spec.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import BLOB, BRIDGE, GPT_PROVIDER, V02, V03, V04, V05, V06

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
