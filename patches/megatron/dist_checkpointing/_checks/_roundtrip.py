"""Checkpoint round trips for the distributed-checkpointing self-checks: a one-rank gloo group, a
temporary directory, megatron-core's own ``dist_checkpointing.save`` / ``load``.

The process group is rendezvoused through a ``FileStore`` in a temporary directory (no port is picked).
When the process already has a group, the checks use it. On a host without CUDA, megatron-core's
torch_dist writer calls ``torch.cuda.synchronize()`` after staging tensors (and the async queue asks
for ``torch.cuda.current_device()``): :func:`without_cuda` stands in for exactly those two calls, and
only where a check is not about them. The writer also logs its memory use through ``psutil``, which
megatron-core does not require: :func:`without_psutil` reports 0 bytes where psutil is not installed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

#: Every wait of a check's process group is bounded by this.
GROUP_TIMEOUT = datetime.timedelta(seconds=60)


@contextlib.contextmanager
def one_rank_gloo() -> Iterator[None]:
    """A gloo process group of one rank for the block (the process's own group if it has one)."""
    if torch.distributed.is_initialized():
        yield
        return
    with tempfile.TemporaryDirectory(prefix="patchkit-store-") as folder:
        store = torch.distributed.FileStore(os.path.join(folder, "store"), 1)
        torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=GROUP_TIMEOUT)
        try:
            yield
        finally:
            torch.distributed.destroy_process_group()


@contextlib.contextmanager
def without_cuda(synchronize: bool = True) -> Iterator[None]:
    """On a host without CUDA, ``current_device`` is the CPU and (unless ``synchronize`` is false)
    ``torch.cuda.synchronize`` does nothing."""
    if torch.cuda.is_available():
        yield
        return
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: "cpu"))
        if synchronize:
            stack.enter_context(mock.patch.object(torch.cuda, "synchronize", lambda *a, **k: None))
        yield


@contextlib.contextmanager
def without_psutil() -> Iterator[None]:
    """Where psutil is not installed, the torch_dist writer's memory log reads 0 bytes instead of raising."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "HAVE_PSUTIL", True):
        yield
        return
    with mock.patch.object(filesystem_async, "_process_memory", lambda: 0):
        yield


def sharded(key: str, tensor: torch.Tensor) -> Any:
    """``tensor`` as megatron's ``ShardedTensor`` of one shard (the whole tensor) under ``key``."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    return ShardedTensor.from_rank_offsets(key, tensor)


def save(state: dict[str, Any], directory: str) -> None:
    """Write ``state`` as a torch_dist checkpoint with megatron-core's synchronous save."""
    from megatron.core import dist_checkpointing

    with without_cuda(), without_psutil():
        dist_checkpointing.save(state, directory)


def load(state: dict[str, Any], directory: str) -> dict[str, Any]:
    """Read the checkpoint in ``directory`` into (a copy of) the sharded ``state``."""
    from megatron.core import dist_checkpointing

    return dict(dist_checkpointing.load(state, directory))


def outcome(call: Any) -> str:
    """``"ok"`` or the exception ``call()`` raised, as ``Type: message`` (the whole message: torch's
    ``CheckpointException`` carries each rank's error in it)."""
    try:
        call()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # torch.distributed.checkpoint's CheckpointException is a BaseException
        return f"{type(exc).__name__}: {exc}"
    return "ok"
