"""Checkpoint common state and sharded objects load under a wider allowlist of safe globals (0.14-0.19).

Declaration module. From torch 2.6, ``torch.load`` defaults to ``weights_only=True``: megatron-core's
``TorchCommonLoadStrategy.load_common`` and ``load_sharded_objects``
(``dist_checkpointing/strategies/common.py``) call it with that default, and megatron-core registers
its own types (``megatron/core/safe_globals.py``, a list that grew from 0.14 to 0.19). A checkpoint
whose common state holds anything else fails to load: the optimizer classes verl allowlists by hand
(``verl/utils/megatron/dist_checkpointing.py:load_dist_checkpointing``: ``torch.optim.AdamW`` and
TransformerEngine's ``FusedAdam``), or types the installed release's list lacks. slime instead
passes ``weights_only=False`` (any pickle runs). The patch keeps ``weights_only`` and loads inside
``torch.serialization.safe_globals``: torch's optimizer classes, TransformerEngine's fused
optimizers when installed, and the newest megatron-core list's types that exist in this release.
More types are added the supported way, ``torch.serialization.add_safe_globals``.

0.19 keeps the common state inside the DCP checkpoint, and torch's ``DefaultLoadPlanner.load_bytes``
unpickles it without ``weights_only``, so such checkpoints load (as under slime's
``weights_only=False``): declared native there, with the check showing the optimizer class come back.
0.17 and 0.18 have no ``TorchCommonLoadStrategy`` and still refuse the optimizer class: no variant yet.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

_COMMON = "megatron.core.dist_checkpointing.strategies.common:TorchCommonLoadStrategy"

PATCHES = (
    Patch(
        id="megatron.dist_ckpt_safe_load",
        self_check="._checks.dist_ckpt_safe_load:check_dist_ckpt_safe_load",
        summary=(
            "dist_checkpointing loads common state and sharded objects weights-only with the optimizer "
            "classes (torch, TransformerEngine) and megatron-core's newest safe types allowlisted."
        ),
        why=(
            "torch >= 2.6 loads weights-only by default; checkpoints holding an optimizer class or a "
            "megatron type the installed release does not register fail to load. verl allowlists the "
            "optimizer classes by hand; slime turns weights_only off altogether."
        ),
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/safe_globals.py",
        removal="Remove with megatron-core 0.18 (0.19 loads the common state through DCP).",
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                label="common-strategy-safe-globals",
                requires={"megatron-core": ">=0.14,<0.17"},
                installs=(
                    Wrap(f"{_COMMON}.load_common", "._dist_ckpt_safe_load:wrap_load"),
                    Wrap(f"{_COMMON}.load_sharded_objects", "._dist_ckpt_safe_load:wrap_load"),
                ),
            ),
            Variant(
                label="native-dcp-common-state",
                requires={"megatron-core": ">=0.19,<0.20"},
                native=("megatron-core 0.19 saves the common state inside the DCP checkpoint, which torch "
                        "unpickles without weights_only"),
            ),
        ),
    ),
)
