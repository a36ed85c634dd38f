"""``bridge.expert_local_to_global``: Expert names map local to global under EP for SequentialMLP
(local_experts.N) too.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import BLOB, BRIDGE, MODEL_BRIDGE, V02_V03, V040_V041, V042, V05_V06

PATCHES = (
    Patch(
        id="bridge.expert_local_to_global",
        self_check="._checks.expert_local_to_global:check_expert_local_to_global",
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
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global",
                         "._expert_local_to_global:wrap_local_name_to_global"),
                ),
            ),
            Variant(
                requires=V040_V041,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global",
                         "._expert_local_to_global:wrap_local_name_to_global"),
                ),
            ),
            Variant(
                # 0.4.2 reads the EP group from the model (_get_ep_group: its pg_collection, else the global
                # group); the names of both expert layouts must come from the same group.
                requires=V042,
                installs=(
                    Wrap(f"{MODEL_BRIDGE}:_megatron_local_name_to_global",
                         "._expert_local_to_global:wrap_local_name_to_global_v042"),
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
)
