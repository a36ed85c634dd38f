"""``megatron.core.utils.get_tensor_model_parallel_group_if_none`` on every supported megatron-core.

Declaration module. mbridge calls this helper; verl adds it to ``megatron.core.utils`` when the
import fails (``apply_patch_mbridge``, inventory row V4), for megatron-core 0.12, which lacks it.
megatron-core 0.13 added it (Megatron-LM !2987) and 0.14-0.19 and main d98e8a6 still have it, so
on every release patchkit supports the patch is declared native, with a check showing upstream's
helper giving the default (expert) tensor-parallel group for ``None`` and a given group back.
"""

from __future__ import annotations

from patchkit import Patch, Variant

from .._constants import MEGATRON_CORE

PATCHES = (
    Patch(
        id="megatron.tp_group_if_none_helper",
        self_check="._checks.tp_group_if_none_helper:check_tp_group_if_none_helper",
        summary="megatron.core.utils.get_tensor_model_parallel_group_if_none exists (mbridge imports it).",
        why=(
            "mbridge imports get_tensor_model_parallel_group_if_none from megatron.core.utils; verl "
            "injects its own copy when the import fails (megatron-core 0.12)."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_v0.13.0/megatron/core/utils.py",
        removal=(
            "Nothing to remove in patchkit (native). Upstream marks the helper 'remove this function "
            "later': re-check on each new release, the check fails if it goes."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="native-0.13",
                requires={"megatron-core": ">=0.14,<0.20"},
                native="megatron-core 0.13 added megatron.core.utils.get_tensor_model_parallel_group_if_none",
            ),
        ),
    ),
)
