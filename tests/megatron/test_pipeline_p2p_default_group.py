"""``megatron.pipeline_p2p_default_group``: batched pipeline send/receive on the default group, on two real
gloo ranks (processes meeting through a file store) and in the self-check."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from _multiprocess import rendezvous, spawn_ranks
from comm_ranks import P2P_ID, pipeline_p2p_rank
from patchkit.patches.megatron.distributed._checks import pipeline_p2p_default_group as check
from patchkit.patches.megatron.distributed._checks.pipeline_p2p_default_group import SHAPE

import patchkit
from patchkit.selfcheck import CheckContext, SelfCheckFailed, upstream_behaviour

RELEASE = tuple(int(part) for part in version("megatron-core").split(".")[:2])


def test_two_stages_exchange_the_same_tensors_with_every_batched_op_on_the_default_group(tmp_path) -> None:
    outcome = spawn_ranks(pipeline_p2p_rank, 2, (2, rendezvous(tmp_path)), timeout=300)
    size = SHAPE[0] * SHAPE[1] * SHAPE[2]
    for rank, by_code in enumerate(outcome):
        peer_value = float(2 - rank)  # what the other stage sent
        upstream_received, upstream_groups = by_code["upstream"]
        patched_received, patched_groups = by_code["patched"]
        assert upstream_received == patched_received == [peer_value] * size
        # Upstream: tensors on the pipeline group (shapes on the default group before 0.16, on the
        # pipeline group from 0.16).
        expected = {"default", "other"} if RELEASE < (0, 16) else {"other"}
        assert set(upstream_groups) == expected, upstream_groups
        assert patched_groups and set(patched_groups) == {"default"}, patched_groups
        assert len(patched_groups) == len(upstream_groups)


@pytest.mark.breaks("megatron.pipeline_p2p_default_group")
def test_the_self_check_sees_the_default_group_and_fails_on_upstream() -> None:
    with patchkit.applied(P2P_ID) as statuses:
        assert [status.state.value for status in statuses] == ["applied"]
        check.check_pipeline_p2p_default_group(CheckContext(P2P_ID))
        with upstream_behaviour(P2P_ID), pytest.raises(SelfCheckFailed, match="default group"):
            check.check_pipeline_p2p_default_group(CheckContext(P2P_ID))


def test_the_patch_is_opt_in() -> None:
    from patchkit.patches.megatron.distributed import pipeline_p2p_default_group

    assert pipeline_p2p_default_group.PATCHES[0].opt_in
