"""Self-check of ``megatron.dist_ckpt_blocking_d2h``: the async writer's preload copies blocking, and
an async torch_dist save completes and loads back."""

from __future__ import annotations

import tempfile
from inspect import signature

import torch

from patchkit.selfcheck import CheckContext, expect

from ._roundtrip import load, one_rank_gloo, outcome, sharded, without_cuda, without_psutil

_WEIGHTS = torch.arange(12, dtype=torch.float32).reshape(3, 4)


def check_dist_ckpt_blocking_d2h(context: CheckContext) -> None:
    """The preload megatron's async save hands over is bound ``non_blocking=False`` and stages the
    tensors without a device synchronize (upstream's calls ``torch.cuda.synchronize()``, which fails on
    a host without CUDA); the save then completes and the checkpoint loads back equal."""
    from megatron.core import dist_checkpointing

    with one_rank_gloo(), tempfile.TemporaryDirectory(prefix="patchkit-ckpt-") as directory:
        state = {"weights": sharded("weights", _WEIGHTS.clone())}
        # 0.17+ default to NVIDIA Resiliency Extension's writer; megatron's own is the one patched.
        mcore_writer = {"async_strategy": "mcore"} if "async_strategy" in signature(dist_checkpointing.save).parameters else {}
        request = dist_checkpointing.save(state, directory, async_sharded_save=True, **mcore_writer)
        preload = request.preload_fn
        expect(preload is not None and preload.keywords.get("non_blocking") is False,
               "the async writer's preload copies device-to-host blocking", "non_blocking=False",
               getattr(preload, "keywords", preload))
        staged = outcome(preload)
        expect(staged == "ok", "staging the tensors needs no device synchronize", "ok", staged)
        with without_cuda(synchronize=False), without_psutil():  # the finalisation all-reduces on current_device()
            request.execute_sync()
        loaded = load({"weights": sharded("weights", torch.zeros(3, 4))}, directory)["weights"]
        expect(torch.equal(loaded, _WEIGHTS), "the checkpoint written through the blocking preload loads back",
               _WEIGHTS.tolist(), loaded.tolist())
