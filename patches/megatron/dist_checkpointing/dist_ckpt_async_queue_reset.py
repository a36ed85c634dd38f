"""``AsyncCallsQueue.reset()``: start the async checkpoint queue afresh, in place (megatron-core 0.14-0.19).

Declaration module. megatron-core's ``AsyncCallsQueue`` (``dist_checkpointing/strategies/async_utils.py``)
numbers its saves with ``call_idx`` and finalises them with an all-reduce that asserts every rank is
at the same index. A process that saved through the queue under a temporary process group (NeMo-RL's
HF-to-Megatron import) must start the training group's saves from a clean queue on every rank:
NeMo-RL closes ``megatron.training.async_utils._async_calls_queue`` and assigns a new one
(``nemo_rl/models/megatron/setup.py:destroy_parallel_state``), which anything holding the old object
never sees. The patch adds ``reset(abandon=False)``: it empties the queue and restarts ``call_idx``
in place, closes the worker processes without a collective (callable after the group is gone),
refuses with ``AsyncCallsPendingError`` while saves are unfinalised unless ``abandon=True`` (then they
are stopped and dropped, with a warning), and returns how many were dropped. Call it on every rank.
"""

from __future__ import annotations

from patchkit import Add, Patch, Variant

_QUEUE = "megatron.core.dist_checkpointing.strategies.async_utils:AsyncCallsQueue"

PATCHES = (
    Patch(
        id="megatron.dist_ckpt_async_queue_reset",
        self_check="._checks.dist_ckpt_async_queue_reset:check_dist_ckpt_async_queue_reset",
        summary=(
            "AsyncCallsQueue.reset(abandon=False) empties the async checkpoint queue and restarts its "
            "call index in place, without collectives."
        ),
        why=(
            "A queue used under a temporary process group leaves ranks at different call indices; NeMo-RL "
            "swaps megatron's global queue object for a new one, which other holders of it never see."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/dist_checkpointing/strategies/async_utils.py"
        ),
        removal="Remove once AsyncCallsQueue has a reset of its own (not in 0.19).",
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                label="close-without-abort",
                requires={"megatron-core": ">=0.14,<0.15"},
                installs=(Add(f"{_QUEUE}.reset", "._dist_ckpt_async_queue_reset:reset_v014"),),
            ),
            Variant(
                label="close-abort",
                requires={"megatron-core": ">=0.15,<0.20"},
                installs=(Add(f"{_QUEUE}.reset", "._dist_ckpt_async_queue_reset:reset"),),
            ),
        ),
    ),
)
