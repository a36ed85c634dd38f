"""Partial checkpoint loads: tensors the checkpoint lacks keep their values (megatron-core 0.14-0.19).

Declaration module. ``MCoreLoadPlanner`` (``dist_checkpointing/strategies/torch.py``) raises
``KeyError`` for any requested tensor the checkpoint does not hold (``_validate_global_shapes``), and
its ``_temporarily_bypass_shape_validation`` indexes the checkpoint metadata by every
``allow_shape_mismatch`` key, so a missing one fails there too. slime edits both out of megatron's
source and passes ``allow_partial_load=True`` (``docker/patch/latest/megatron.patch``), to load a
checkpoint into a model that has grown tensors (new heads, MTP layers). With the patch, the planner
leaves the missing keys out of the load plan, logs them, and the returned state dict holds the
values those tensors had when the sharded state dict was built. Tensors that are in the checkpoint
are checked as upstream does: a global shape mismatch still raises unless the tensor is marked
``allow_shape_mismatch``. Opt-in: it turns a load that would fail into one that succeeds.
Upstream's ``dist_checkpointing.load(strict="log_unexpected")`` drops such keys from the result
instead (the caller must then load non-strictly); the patch serves code that calls ``load`` with
the default strictness.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

_PLANNER = "megatron.core.dist_checkpointing.strategies.torch:MCoreLoadPlanner"

PATCHES = (
    Patch(
        id="megatron.dist_ckpt_partial_load",
        self_check="._checks.dist_ckpt_partial_load:check_dist_ckpt_partial_load",
        summary=(
            "torch_dist loads skip tensors the checkpoint lacks (logged; they keep their current values) "
            "instead of raising KeyError; present tensors keep upstream's shape check."
        ),
        why=(
            "Loading a checkpoint into a model with tensors the checkpoint lacks (added heads, MTP "
            "layers) fails in MCoreLoadPlanner; slime patches megatron's source to skip them."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/dist_checkpointing/strategies/torch.py"
        ),
        removal="Remove once MCoreLoadPlanner takes allow_partial_load from its caller (not in 0.19).",
        opt_in=True,
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(Wrap(f"{_PLANNER}.create_local_plan", "._dist_ckpt_partial_load:wrap_create_local_plan"),),
            ),
        ),
    ),
)
