"""Blocking device-to-host copies in the async checkpoint writer (megatron-core 0.14-0.19).

Declaration module. ``FileSystemWriterAsync.get_save_function_and_args``
(``dist_checkpointing/strategies/filesystem_async.py``) hands the caller a preload function bound
as ``partial(self.preload_tensors, self.write_buckets, True)``: every tensor is copied to the host
with ``non_blocking=True``, then ``torch.cuda.synchronize()``. On some GPU/CPU pairings that copy
segfaults (ROLL's ``patch_megatron_preload_tensors_non_blocking``, ``ckpt_d2h_non_blocking=False``
by default), and on a host with no CUDA driver the synchronize raises, so no torch_dist checkpoint
can be written there at all (from 0.15 the synchronous save runs the same preload). The patch binds
``non_blocking=False`` instead: plain blocking copies, no device synchronize. Opt-in, as it trades
the overlap of the pinned copies for safety; enable it with ``PATCHKIT_ENABLE``.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

_WRITER = "megatron.core.dist_checkpointing.strategies.filesystem_async:FileSystemWriterAsync"

PATCHES = (
    Patch(
        id="megatron.dist_ckpt_blocking_d2h",
        self_check="._checks.dist_ckpt_blocking_d2h:check_dist_ckpt_blocking_d2h",
        summary=(
            "The async torch_dist checkpoint writer stages tensors to the host with blocking copies "
            "(non_blocking=False, no torch.cuda.synchronize)."
        ),
        why=(
            "The writer's pinned non-blocking device-to-host copies segfault on some GPU/CPU pairings "
            "(ROLL forces them blocking by default), and its torch.cuda.synchronize() fails every "
            "torch_dist save on a host without CUDA."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/dist_checkpointing/strategies/filesystem_async.py"
        ),
        removal="Remove once megatron-core lets the caller choose non_blocking for the preload (not in 0.19).",
        opt_in=True,
        version_modules={"megatron-core": "megatron.core"},
        variants=(
            Variant(
                requires={"megatron-core": ">=0.14,<0.20"},
                installs=(
                    Wrap(f"{_WRITER}.get_save_function_and_args",
                         "._dist_ckpt_blocking_d2h:wrap_get_save_function_and_args"),
                ),
            ),
        ),
    ),
)
