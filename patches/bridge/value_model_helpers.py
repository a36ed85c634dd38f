"""Megatron-Bridge 0.5's value-model helpers in ``train_utils`` on Bridge 0.2 to 0.4.

Declaration module (data only; see docs/writing-patches.md). Bridge 0.5 added to
``megatron.bridge.training.utils.train_utils`` the pieces an RL trainer builds a critic or reward model
from: ``LinearForLastLayer`` (a replicated value head called like Megatron's output layer, float32
output, sequence-parallel gather), ``create_value_head_hook`` and ``make_value_model`` (a pre-wrap hook
giving each last pipeline stage that head) and ``freeze_moe_router`` (no gradients to MoE router and
shared-expert gate parameters); its ``AutoMapping`` registry lists ``LinearForLastLayer`` as replicated,
so exporting the model copies the head whole. verl imports them from ``train_utils`` and keeps its own
copies for older Bridges (``verl/models/mcore/bridge.py``). The patch adds the four names to
``train_utils`` and the class name to the registry.

Ranges, from the wheels: 0.2.0rc6, 0.3.1 and 0.4.2 have none of the names and no registry entry; 0.5.0,
0.5.1 and 0.6.2 have them, with the same code. Tests ran on 0.2.0rc6, 0.3.1 and 0.4.2 (patched) and
0.6.2 (native), each with the same assertions; on 0.6.2 the backport also runs beside Bridge's own
functions on one model.
"""

from __future__ import annotations

from patchkit import Add, Call, Patch, Variant

from ._constants import BRIDGE, TRAIN_UTILS, V02_V04, V05_V06

_IMPLEMENTATION = "._value_model_helpers"

PATCHES = (
    Patch(
        id="bridge.value_model_helpers",
        self_check="._checks.value_model_helpers:check_value_model_helpers",
        summary=(
            "train_utils.LinearForLastLayer, create_value_head_hook, make_value_model and freeze_moe_router "
            "on Bridge 0.2-0.4, the head replicated in AutoMapping's registry."
        ),
        why=(
            "Bridge 0.5 added the value-head and router-freezing helpers RL critics are built with; verl keeps "
            "its own copies for Bridge < 0.5 and registers the head's parallelism itself."
        ),
        upstream=(
            "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.5.1/src/megatron/bridge/training/utils/"
            "train_utils.py"
        ),
        removal="Native from Bridge 0.5; remove with support for Bridge < 0.5.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V02_V04,
                installs=(
                    Add(f"{TRAIN_UTILS}:LinearForLastLayer", f"{_IMPLEMENTATION}:LinearForLastLayer"),
                    Add(f"{TRAIN_UTILS}:create_value_head_hook", f"{_IMPLEMENTATION}:create_value_head_hook"),
                    Add(f"{TRAIN_UTILS}:make_value_model", f"{_IMPLEMENTATION}:make_value_model"),
                    Add(f"{TRAIN_UTILS}:freeze_moe_router", f"{_IMPLEMENTATION}:freeze_moe_router"),
                    # After train_utils, not param_mapping: the names must be there when `from train_utils
                    # import ...` finishes; the implementation module imports param_mapping itself.
                    Call(f"{_IMPLEMENTATION}:register_value_head", f"{_IMPLEMENTATION}:unregister_value_head",
                         after=TRAIN_UTILS),
                ),
                label="v051-backport",
            ),
            Variant(
                requires=V05_V06,
                native=(
                    "train_utils has LinearForLastLayer, create_value_head_hook, make_value_model and "
                    "freeze_moe_router; AutoMapping lists LinearForLastLayer as replicated"
                ),
            ),
        ),
    ),
)
