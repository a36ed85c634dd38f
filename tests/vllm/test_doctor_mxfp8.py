"""`patchkit doctor` on the real vLLM (CPU, emulation kernels selected): the ModelOpt MXFP8 refit self-check
verifies a load -> refit -> refit-back round trip against vLLM's own first loads, and fails when the patch
is bypassed."""

from __future__ import annotations

import pytest

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import patches_as_they_were, upstream_behaviour

MXFP8 = "vllm.mxfp8_refit"


@pytest.fixture(autouse=True)
def _doctor_leaves_no_patch_applied():
    with patches_as_they_were():
        yield


def test_mxfp8_refit_check_is_verified():
    with patchkit.applied(MXFP8):
        (verdict,) = run([MXFP8], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.mxfp8_refit")
def test_mxfp8_refit_check_fails_with_upstreams_layer_methods():
    with patchkit.applied(MXFP8), upstream_behaviour(MXFP8):
        (verdict,) = run([MXFP8], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "refit with a second checkpoint of vLLM's ModelOpt MXFP8 fused-MoE layer: expected the layer takes the " \
        "new weights, found RefitError" in verdict.message, verdict.message
    assert "processed before patchkit recorded it" in verdict.message, verdict.message
