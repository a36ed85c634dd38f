"""``apply_swiglu_sharded_factory(singleton_local_shards=...)`` for ModelOpt/Bridge QAT checkpoints.

Declaration module. Megatron-Bridge and ModelOpt's Megatron plugin build the sharded state dict of
the swiglu ``linear_fc1`` with ``singleton_local_shards``; megatron-core has the parameter natively
from 0.14 (``megatron/core/transformer/mlp.py``), the oldest release the Bridge versions patchkit
supports (0.2: megatron-core >=0.14) can run with. Releases before 0.14 are not covered: no variant,
so the patch reports ``unsupported_version`` there instead of pretending.
"""

from __future__ import annotations

from patchkit import Patch, Variant

PATCHES = (
    Patch(
        id="megatron.swiglu_singleton_local_shards",
        summary="apply_swiglu_sharded_factory accepts singleton_local_shards (needed by QAT checkpoints).",
        why="Bridge/ModelOpt pass singleton_local_shards when sharding swiglu fc1; megatron-core < 0.14 lacks it.",
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.14.0/megatron/core/transformer/mlp.py",
        removal="Remove once megatron-core < 0.14 is out of support (already native in every supported range).",
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14.0rc0"},
                native="megatron-core 0.14 added apply_swiglu_sharded_factory(singleton_local_shards=False)",
            ),
        ),
    ),
)
