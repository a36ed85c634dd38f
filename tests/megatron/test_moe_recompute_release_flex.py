"""megatron.moe_recompute_release on the flex dispatcher (DeepEP, HybridEP), two CPU ranks (gloo, EP=2).

DeepEP and HybridEP are CUDA-only libraries: ``flex_ep_harness`` stands in for their buffers (and
nothing else); ``MoEFlexTokenDispatcher``, its managers and megatron-core's autograd functions around
the buffers are upstream's. DeepEP asserts TPxEP > 1, hence two ranks. Upstream's manager keeps its
top-k ``token_probs`` after backward, and through their graph each layer's recomputed forward;
with the patch no tensor of the dispatch outlives backward, and loss and gradients are bit for bit
upstream's. With shared-expert overlap (flex from 0.18) the shared experts' caches are released by
upstream itself: the test shows none outlives backward, patched or not.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from flex_recompute_ranks import case_id, flex_rank
from packaging.version import Version

log = logging.getLogger(__name__)


def _release() -> Version:
    from importlib.metadata import version

    return Version(version("megatron-core"))


def _backends() -> list[str]:
    return ["deepep", "hybridep"] if _release() >= Version("0.16") else ["deepep"]


def _shared_expert_overlap_on_flex() -> bool:
    return _release() >= Version("0.18")  # before, MoEFlexTokenDispatcher.set_shared_experts raises


EXPECTED_VARIANT = [(Version("0.19"), "release-after-combine-ncclep"),
                    (Version("0.16"), "release-after-combine-hybridep"),
                    (Version("0.14"), "release-after-combine")]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Both ranks' results for every case of this release (one launch for the module)."""
    from _multiprocess import rendezvous, spawn_ranks

    cases = [(backend, recompute, False) for backend in _backends() for recompute in (True, False)]
    if _shared_expert_overlap_on_flex():
        cases.append(("deepep", True, True))
    return spawn_ranks(flex_rank, 2, (2, rendezvous(tmp_path_factory.mktemp("flex")), cases), timeout=1500)


def _each_rank(ranks: list[dict[str, Any]], case: str) -> list[dict[str, Any]]:
    return [results[case] for results in ranks]


def test_flex_variant_matches_the_release(ranks):
    expected = next(label for first, label in EXPECTED_VARIANT if _release() >= first)
    assert {result["variant"] for results in ranks for result in results.values()} == {expected}


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_full_recompute_keeps_nothing_of_the_dispatch_after_backward(ranks, backend):
    """Upstream: each layer's manager still holds ``token_probs`` with the recomputed graph (and the
    step's maps and indices); patched: nothing reachable with autograd history, no tensor of the step."""
    if backend not in _backends():
        pytest.skip(f"megatron-core {_release()} has no HybridEP manager")
    for rank, result in enumerate(_each_rank(ranks, case_id(backend, True, False))):
        upstream, patched = result["upstream"], result["patched"]
        log.info("rank %d %s, full recompute, held after backward: upstream %d tensors / %d B %s, patched %d / %d B",
                 rank, backend, upstream["count"], upstream["bytes"], upstream["step_tensors"], patched["count"],
                 patched["bytes"])
        # token_probs on every release and backend; the dispatched probs too where upstream keeps them
        # (HybridEP; DeepEP before 0.18).
        manager = "decoder.layers.{}.mlp.token_dispatcher._comm_manager."
        assert {manager.format(i) + "token_probs" for i in (0, 1)} <= set(upstream["holders"])
        assert all(h.startswith((manager.format(0), manager.format(1))) for h in upstream["holders"])
        assert all("token_dispatcher._comm_manager.token_probs" in held
                   for held in upstream["step_tensors"].values())
        assert patched["holders"] == []
        assert all(held == [] for held in patched["step_tensors"].values()), patched["step_tensors"]
        assert patched["bytes"] < upstream["bytes"]


@pytest.mark.parametrize("recompute", [True, False], ids=["full-recompute", "no-recompute"])
@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_loss_and_gradients_are_bit_equal_to_upstream(ranks, backend, recompute):
    if backend not in _backends():
        pytest.skip(f"megatron-core {_release()} has no HybridEP manager")
    for result in _each_rank(ranks, case_id(backend, recompute, False)):
        assert result["same_loss"]
        assert result["num_grads"] > 0 and result["unequal_grads"] == []


def test_flex_shared_expert_overlap_caches_do_not_outlive_backward(ranks):
    """Shared experts overlapped with the flex dispatch (0.18+): upstream already drops each cache where
    it is consumed, so neither run keeps one; the patch still releases the dispatch, numbers unchanged."""
    if not _shared_expert_overlap_on_flex():
        pytest.skip(f"megatron-core {_release()}: the flex dispatcher refuses shared-expert overlap")
    for result in _each_rank(ranks, case_id("deepep", True, True)):
        upstream, patched = result["upstream"], result["patched"]
        assert not any(name.startswith("shared_experts.") for side in (upstream, patched)
                       for held in side["step_tensors"].values() for name in held)
        assert upstream["holders"] and patched["holders"] == []
        assert all(held == [] for held in patched["step_tensors"].values())
        assert result["same_loss"] and result["unequal_grads"] == []
