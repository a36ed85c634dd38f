"""Distributed-checkpointing patches: real torch_dist checkpoint round trips through megatron-core on a
one-rank gloo group (rendezvous through a FileStore), on the CPU.

Each patch's self-check is run with the patch applied (it must pass) and again with upstream's code put
back (it must fail: the check proves the patch, not merely that checkpoints work). The CPU stand-ins
are those of the self-checks' harness (``_checks/_roundtrip.py``): ``torch.cuda.current_device`` and,
except in the blocking-copy check, ``torch.cuda.synchronize``; psutil's memory log where psutil is absent.
"""

from __future__ import annotations

import functools
import multiprocessing
import signal
import tempfile
import time
from importlib.metadata import version

import pytest
import torch
from patchkit.patches.megatron._errors import AsyncCallsPendingError, DistCheckpointingError
from patchkit.patches.megatron.dist_checkpointing._checks import (
    dist_ckpt_async_queue_reset,
    dist_ckpt_blocking_d2h,
    dist_ckpt_partial_load,
    dist_ckpt_safe_load,
)
from patchkit.patches.megatron.dist_checkpointing._checks._roundtrip import (
    load,
    one_rank_gloo,
    outcome,
    save,
    sharded,
    without_cuda,
)

import patchkit
from patchkit.selfcheck import CheckContext, SelfCheckFailed, upstream_behaviour

RELEASE = tuple(int(part) for part in version("megatron-core").split(".")[:2])


def _run_check(patch_id: str, check, native: bool = False) -> None:
    check(CheckContext(patch_id, native=native))


def _applies_and_its_check_fails_as_upstream(patch_id: str, check, error: type[Exception], match: str) -> None:
    """The patch applies and its self-check passes; with upstream's code back the check raises ``error``."""
    with patchkit.applied(patch_id) as statuses:
        assert [s.state.value for s in statuses] == ["applied"]
        _run_check(patch_id, check)
        with upstream_behaviour(patch_id), pytest.raises(error, match=match):
            _run_check(patch_id, check)


@pytest.mark.breaks("megatron.dist_ckpt_blocking_d2h")
def test_async_writer_preload_copies_blocking_and_the_async_save_loads_back():
    _applies_and_its_check_fails_as_upstream("megatron.dist_ckpt_blocking_d2h",
                                             dist_ckpt_blocking_d2h.check_dist_ckpt_blocking_d2h,
                                             SelfCheckFailed, "non_blocking=False")


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the failure of a host without CUDA")
@pytest.mark.skipif(RELEASE < (0, 15), reason="0.14's synchronous save does not run the preload")
def test_without_the_patch_a_torch_dist_save_fails_on_a_host_without_cuda():
    with one_rank_gloo(), tempfile.TemporaryDirectory() as directory:
        from megatron.core import dist_checkpointing

        failed = outcome(lambda: dist_checkpointing.save({"w": sharded("w", torch.ones(2))}, directory))
    assert "NVIDIA driver" in failed or "CUDA" in failed


def test_blocking_preload_refuses_a_preload_it_does_not_know():
    from patchkit.patches.megatron.dist_checkpointing._dist_ckpt_blocking_d2h import blocking_preload

    with pytest.raises(DistCheckpointingError, match="functools.partial"):
        blocking_preload(lambda: None)
    with pytest.raises(DistCheckpointingError, match="non_blocking"):
        blocking_preload(functools.partial(lambda buckets: buckets, []))
    rebound = blocking_preload(functools.partial(lambda buckets, non_blocking=True: non_blocking, [], True))
    assert rebound() is False


@pytest.mark.breaks("megatron.dist_ckpt_safe_load")
@pytest.mark.skipif((0, 17) <= RELEASE < (0, 19), reason="no variant for 0.17-0.18 (no TorchCommonLoadStrategy)")
def test_common_state_holding_an_optimizer_class_loads_weights_only():
    patch_id = "megatron.dist_ckpt_safe_load"
    with patchkit.applied(patch_id) as statuses:
        native = statuses[0].reason == "native"
        assert native == (RELEASE >= (0, 19))
        _run_check(patch_id, dist_ckpt_safe_load.check_dist_ckpt_safe_load, native=native)
        if not native:
            with upstream_behaviour(patch_id), pytest.raises(SelfCheckFailed, match="AdamW"):
                _run_check(patch_id, dist_ckpt_safe_load.check_dist_ckpt_safe_load)


@pytest.mark.breaks("megatron.dist_ckpt_partial_load")
def test_a_checkpoint_loads_into_a_model_with_tensors_it_lacks_when_enabled():
    _applies_and_its_check_fails_as_upstream("megatron.dist_ckpt_partial_load",
                                             dist_ckpt_partial_load.check_dist_ckpt_partial_load,
                                             SelfCheckFailed, "lacks")


def test_partial_load_is_opt_in_and_upstream_refuses_a_missing_tensor():
    from patchkit.patches.megatron.dist_checkpointing import dist_ckpt_blocking_d2h, dist_ckpt_partial_load

    assert dist_ckpt_partial_load.PATCHES[0].opt_in and dist_ckpt_blocking_d2h.PATCHES[0].opt_in
    with one_rank_gloo(), tempfile.TemporaryDirectory() as directory:
        save({"w": sharded("w", torch.ones(2))}, directory)
        refused = outcome(lambda: load({"w": sharded("w", torch.zeros(2)), "x": sharded("x", torch.zeros(1))},
                                       directory))
    assert "x from model not in state dict" in refused


@pytest.mark.breaks("megatron.dist_ckpt_async_queue_reset")
def test_async_queue_reset_restarts_call_indices_in_place():
    _applies_and_its_check_fails_as_upstream("megatron.dist_ckpt_async_queue_reset",
                                             dist_ckpt_async_queue_reset.check_dist_ckpt_async_queue_reset,
                                             AttributeError, "reset")


def test_the_queue_check_leaves_no_save_running_when_it_fails():
    """A failing check must not leave its pending save writing into the directory being removed."""
    before = set(multiprocessing.active_children())
    with patchkit.applied("megatron.dist_ckpt_async_queue_reset"):
        with upstream_behaviour("megatron.dist_ckpt_async_queue_reset"), pytest.raises(AttributeError):
            _run_check("megatron.dist_ckpt_async_queue_reset",
                       dist_ckpt_async_queue_reset.check_dist_ckpt_async_queue_reset)
    assert set(multiprocessing.active_children()) - before == set()


def test_after_reset_with_abandon_the_abandoned_save_has_exited():
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue, AsyncRequest

    with patchkit.applied("megatron.dist_ckpt_async_queue_reset"), one_rank_gloo(), without_cuda():
        queue = AsyncCallsQueue()
        queue.schedule_async_request(AsyncRequest(time.sleep, (30,), []))
        workers = [active.async_caller.process for active in queue.async_calls]
        workers += [getattr(type(queue), "_persistent_caller", None)] if queue.persistent else []
        workers = [getattr(worker, "process", worker) for worker in workers if worker is not None]
        assert queue.reset(abandon=True) == 1
        assert workers and [worker.exitcode for worker in workers] == [-signal.SIGKILL] * len(workers)


def test_async_queue_reset_refusal_is_a_patchkit_error():
    error = AsyncCallsPendingError(2)
    assert isinstance(error, patchkit.PatchkitError) and error.pending == 2
    assert "abandon=True" in str(error)
