"""``apply_swiglu_sharded_factory(singleton_local_shards=...)`` for ModelOpt QAT checkpoints.

Declaration module. ModelOpt's quantized ``SequentialMLP`` (``plugins/megatron.py``, 0.43-0.47)
sets ``metadata["singleton_local_shards"] = True`` so that each expert is saved as its own shard;
megatron-core's ``MLP.sharded_state_dict`` passes that flag to ``apply_swiglu_sharded_factory`` for
the swiglu ``linear_fc1``, which accepts it from megatron-core 0.14 (``transformer/mlp.py``).
Every megatron-core the supported Bridge releases run with (0.2: >=0.14) has it, so the patch is
declared native there. Releases before 0.14 get no variant: the patch then reports
``unsupported_version`` rather than pretending to cover them.
"""

from __future__ import annotations

from patchkit import Patch, Variant

from .._constants import MEGATRON_CORE

PATCHES = (
    Patch(
        id="megatron.swiglu_singleton_local_shards",
        self_check="._checks.swiglu_singleton_local_shards:check_swiglu_singleton_local_shards",
        summary="apply_swiglu_sharded_factory accepts singleton_local_shards (needed by QAT checkpoints).",
        why="ModelOpt's quantized SequentialMLP shards swiglu fc1 with singleton_local_shards; core < 0.14 lacks it.",
        upstream="https://github.com/NVIDIA/Megatron-LM/blob/core_r0.14.0/megatron/core/transformer/mlp.py",
        removal="Remove once megatron-core < 0.14 is out of support (already native in every supported range).",
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14.0rc0"},
                native="megatron-core 0.14 added apply_swiglu_sharded_factory(singleton_local_shards=False)",
            ),
        ),
    ),
)
