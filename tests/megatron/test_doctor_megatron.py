"""`patchkit doctor` on the real megatron-core: each Megatron self-check verifies its patch, and fails
when the patch is bypassed (upstream's code back in place while the status still says applied)."""

from __future__ import annotations

import pytest

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

CHECKED = ("megatron.mtp_postprocess", "megatron.mtp_detach_inputs", "megatron.swiglu_singleton_local_shards")


@pytest.fixture
def applied_mtp():
    with patchkit.applied("megatron.mtp_postprocess", "megatron.mtp_detach_inputs"):
        yield


def verdicts(*patterns: str) -> dict[str, object]:
    return {v.id: v for v in run(patterns, device="cpu")[0]}


def test_every_megatron_check_with_a_self_check_is_verified(applied_mtp):
    found = verdicts(*CHECKED)
    assert {pid: found[pid].verdict for pid in CHECKED} == dict.fromkeys(CHECKED, VERIFIED), \
        {pid: found[pid].message for pid in CHECKED}


def test_mtp_postprocess_check_fails_with_upstreams_forward(applied_mtp):
    with upstream_behaviour("megatron.mtp_postprocess"):
        (verdict,) = run(["megatron.mtp_postprocess"], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "returns main-head logits [batch, seq, vocab] when MTP is on: expected (2, 16, 128), found (2, 16)" \
        in verdict.message


def test_mtp_detach_check_fails_with_upstreams_embeddings(applied_mtp):
    with upstream_behaviour("megatron.mtp_detach_inputs"):
        (verdict,) = run(["megatron.mtp_detach_inputs"], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "the MTP loss leaves the embedding's gradient unchanged" in verdict.message


def test_swiglu_native_check_fails_on_a_core_without_the_parameter(monkeypatch):
    from megatron.core.transformer import mlp

    monkeypatch.setattr(mlp, "apply_swiglu_sharded_factory", lambda original_sh_ten, sharded_offsets: None)
    (verdict,) = run(["megatron.swiglu_singleton_local_shards"], device="cpu")[0]
    assert verdict.verdict == FAILED and "takes singleton_local_shards" in verdict.message
