"""``HybridDeviceOptimizer`` loads a state dict when some or all of its parameters are fp32 (megatron-core 0.14-0.19).

Declaration module. With ``param_update_in_fp32=True`` (what ``get_megatron_optimizer`` always
passes for CPU offloading) the optimizer keeps an fp32 copy of each parameter that is not fp32
already (``param_to_fp32_param``), and after ``load_state_dict`` copies each loaded
``master_param`` into that copy (``_update_fp32_params_by_new_state``). That method looks the copy up
for *every* parameter with state, so an fp32 parameter, which has none, raises ``KeyError``: the
distributed optimizer hands it only fp32 main parameters, and every checkpoint load fails. ROLL
returns early when no parameter has a copy (``mcore_adapter/src/mcore_adapter/patcher.py``
``patch_hybrid_optimizer``; inventory row R2); the patch skips each parameter without a copy, which
serves a mix of fp32 and half-precision parameters too (``._hybrid_optimizer_fp32_state``).
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_HYBRID_OPTIMIZER = "megatron.core.optimizer.cpu_offloading.hybrid_optimizer:HybridDeviceOptimizer"

PATCHES = (
    Patch(
        id="megatron.hybrid_optimizer_fp32_state",
        self_check="._checks.hybrid_optimizer_fp32_state:check_hybrid_optimizer_fp32_state",
        summary=(
            "HybridDeviceOptimizer(param_update_in_fp32=True) loads a state dict when some or all of "
            "its parameters are fp32: only parameters with an fp32 copy get the loaded master_param."
        ),
        why=(
            "_update_fp32_params_by_new_state looks up param_to_fp32_param[param] for every parameter "
            "with state, but fp32 parameters get no copy; the distributed optimizer passes fp32 main "
            "parameters only, so load_state_dict (every checkpoint load with CPU offloading) raises "
            "KeyError. ROLL patches the method to return when no copy exists."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.2/megatron/core/optimizer/"
            "cpu_offloading/hybrid_optimizer.py (_update_fp32_params_by_new_state)"
        ),
        removal=(
            "Remove once _update_fp32_params_by_new_state skips parameters without an fp32 copy: "
            "unchanged in 0.14.0-0.19.2."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="skip-params-without-fp32-copy",
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{_HYBRID_OPTIMIZER}._update_fp32_params_by_new_state",
                         "._hybrid_optimizer_fp32_state:wrap_update_fp32_params_by_new_state"),
                ),
            ),
        ),
    ),
)
