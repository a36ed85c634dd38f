"""``bridge.expert_sort_key``: Export sort keys order experts numerically in both namings (local_experts.N and
weightN).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import BLOB, BRIDGE, MODEL_BRIDGE, V02_V03, V04, V05_V06

PATCHES = (
    Patch(
        id="bridge.expert_sort_key",
        self_check="._checks.expert_sort_key:check_expert_sort_key",
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
                installs=(Wrap(f"{MODEL_BRIDGE}:extract_sort_key", "._expert_sort_key:wrap_extract_sort_key"),),
            ),
            Variant(
                requires=V04,
                installs=(Wrap(f"{MODEL_BRIDGE}:extract_sort_key", "._expert_sort_key:wrap_extract_sort_key"),),
            ),
            Variant(requires=V05_V06, native="extract_sort_key reads local_experts.N when there is no weightN/biasN"),
        ),
    ),
)
