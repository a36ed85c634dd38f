"""`patchkit doctor` on the real vLLM (CPU, Marlin stand-ins): the MXFP4 MoE refit self-check verifies a load ->
refit -> refit-back round trip against vLLM's own first loads, and fails when the patch is bypassed."""

from __future__ import annotations

import pytest

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import patches_as_they_were, upstream_behaviour

MXFP4 = "vllm.mxfp4_moe_refit"


@pytest.fixture(autouse=True)
def _doctor_leaves_no_patch_applied():
    with patches_as_they_were():
        yield


def test_mxfp4_moe_refit_check_is_verified():
    with patchkit.applied(MXFP4):
        (verdict,) = run([MXFP4], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.mxfp4_moe_refit")
def test_mxfp4_moe_refit_check_fails_with_upstreams_layer_methods():
    with patchkit.applied(MXFP4), upstream_behaviour(MXFP4):
        (verdict,) = run([MXFP4], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "refit with a second checkpoint of vLLM's MXFP4 MoE layer: expected the layer takes the new weights, " \
        "found RefitError" in verdict.message, verdict.message
