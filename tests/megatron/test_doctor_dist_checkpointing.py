"""`patchkit doctor` on the real megatron-core for the distributed-checkpointing patches: each
self-check verifies its patch, and fails when upstream's code is back in the patch's place (the
patch bypassed while its status still says applied)."""

from __future__ import annotations

import pytest

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason
from patchkit.selfcheck import upstream_behaviour

pytestmark = pytest.mark.usefixtures("patches_restored")


def _verdict(patch_id: str):
    (verdict,) = run([patch_id], device="cpu")[0]
    return verdict


def _verified_then_failed_with_upstream(patch_id: str) -> None:
    with patchkit.applied(patch_id) as (status,):
        if status.reason is Reason.NATIVE:
            pytest.skip(f"{patch_id} is native on this release: upstream's own code is what the check verifies")
        if status.state.value != "applied":
            pytest.skip(f"{patch_id} installs nothing on this release ({status.state.value}): nothing to bypass")
        verified = _verdict(patch_id)
        with upstream_behaviour(patch_id):
            bypassed = _verdict(patch_id)
    assert verified.verdict == VERIFIED, verified.message
    assert bypassed.verdict == FAILED, bypassed.message


@pytest.mark.breaks("megatron.dist_ckpt_async_queue_reset")
def test_async_queue_reset_check_fails_on_upstreams_queue_without_reset():
    _verified_then_failed_with_upstream("megatron.dist_ckpt_async_queue_reset")


@pytest.mark.breaks("megatron.dist_ckpt_blocking_d2h")
def test_blocking_d2h_check_fails_with_upstreams_non_blocking_preload():
    _verified_then_failed_with_upstream("megatron.dist_ckpt_blocking_d2h")


@pytest.mark.breaks("megatron.dist_ckpt_partial_load")
def test_partial_load_check_fails_with_upstreams_load_planner():
    _verified_then_failed_with_upstream("megatron.dist_ckpt_partial_load")


@pytest.mark.breaks("megatron.dist_ckpt_safe_load")
def test_safe_load_check_fails_with_upstreams_common_state_loader():
    _verified_then_failed_with_upstream("megatron.dist_ckpt_safe_load")
