"""``bridge.quant_linear_parallelism``: AutoMapping knows the column/row parallelism of ModelOpt's Quant*
Megatron linears.
"""

from __future__ import annotations

from patchkit import Call, Patch, Variant, Wrap

from .._constants import BLOB, BRIDGE, PARAM_MAPPING, V02_V03, V04_V06

PATCHES = (
    Patch(
        id="bridge.quant_linear_parallelism",
        self_check="._checks.quant_linear_parallelism:check_quant_linear_parallelism",
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
)
