"""megatron.moe_recompute_release: under full recompute, MoE dispatchers no longer keep the recomputed graph.

A tiny MoE GPT (2 layers, 8 experts, top-2) trained one step with ``recompute_granularity='full'``,
on each dispatcher that runs on CPU. Upstream keeps the dispatcher's probs after backward, and
through their graph each checkpoint's detached input and its gradient; with the patch nothing with
autograd history is reachable from the model, and loss and gradients are bit for bit upstream's,
MTP layers (recomputed through ``megatron.mtp_recompute``) included.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import torch
from patchkit.patches.megatron.moe._checks._moe_recompute_probe import (
    SHARED_EXPERT_CACHES,
    Step,
    build_moe_gpt,
    step_tensors,
    train_step,
)

import patchkit
from patchkit.selfcheck import upstream_behaviour

PATCH = "megatron.moe_recompute_release"
DISPATCHERS = ("alltoall", "allgather")
HOLDER = {"alltoall": "token_dispatcher.probs", "allgather": "token_dispatcher.local_probs"}
# The tiny GPT's layer input: [seq 16, batch 2, hidden 64] float32.
LAYER_INPUT_BYTES = 16 * 2 * 64 * 4

log = logging.getLogger(__name__)


@pytest.fixture
def moe_cpu(megatron_cpu: None) -> Iterator[None]:
    from moe_harness import cpu_moe

    with cpu_moe():
        yield


def _steps(dispatcher: str, **build: object) -> tuple[Step, Step]:
    """One step of the same model with the patch, then with upstream's dispatchers."""
    with patchkit.applied(PATCH, "megatron.mtp_recompute"):
        patched = train_step(build_moe_gpt(dispatcher, **build))
        with upstream_behaviour(PATCH):
            upstream = train_step(build_moe_gpt(dispatcher, **build))
    return patched, upstream


def _assert_bit_equal(patched: Step, upstream: Step) -> None:
    assert torch.equal(patched.loss, upstream.loss)
    assert patched.grads.keys() == upstream.grads.keys() and patched.grads
    unequal = [name for name in upstream.grads if not torch.equal(patched.grads[name], upstream.grads[name])]
    assert not unequal


def test_patch_is_applied_on_every_release(megatron_cpu):
    from importlib.metadata import version

    from packaging.version import Version

    release = Version(version("megatron-core"))
    expected = ("release-after-combine-ncclep" if release >= Version("0.19") else
                "release-after-combine-hybridep" if release >= Version("0.16") else "release-after-combine")
    with patchkit.applied(PATCH) as (status,):
        record = status.to_dict()
    assert (record["state"], record["variant"]) == ("applied", expected)


#: What each dispatcher keeps from a step besides its probs (NeMo-RL clears these before a refit).
STEP_MAPS = {"alltoall": ["token_dispatcher.reversed_local_input_permutation_mapping", "token_dispatcher.routing_map"],
             "allgather": ["token_dispatcher.local_map", "token_dispatcher.reversed_local_input_permutation_mapping"]}


@pytest.mark.parametrize("dispatcher", DISPATCHERS)
def test_routing_maps_and_mappings_are_released_after_combine(moe_cpu, dispatcher):
    """Upstream keeps the step's routing map and permutation mapping until the next forward; patched,
    the dispatcher holds neither (nor its probs) once the step is done."""
    def held(model: object) -> set[str]:
        train_step(model)
        return {name for names in step_tensors(model).values() for name in names}

    with patchkit.applied(PATCH):
        patched = held(build_moe_gpt(dispatcher))
        with upstream_behaviour(PATCH):
            upstream = held(build_moe_gpt(dispatcher))
    assert set(STEP_MAPS[dispatcher]) <= upstream
    assert not patched & (set(STEP_MAPS[dispatcher]) | {f"token_dispatcher.{HOLDER[dispatcher].split('.')[-1]}"})


def test_shared_expert_overlap_caches_do_not_outlive_backward(moe_cpu):
    """Shared experts overlapped with the all-to-all dispatch, full recompute: upstream drops each overlap
    cache where it is consumed, so neither run keeps one; with the patch nothing with autograd
    history is reachable, and loss and gradients are upstream's."""
    overlap = {"moe_shared_expert_intermediate_size": 32, "moe_shared_expert_overlap": True}
    runs = {}
    with patchkit.applied(PATCH):
        for side in ("patched", "upstream"):
            with upstream_behaviour(PATCH) if side == "upstream" else contextlib.nullcontext():
                model = build_moe_gpt("alltoall", config=overlap)
                runs[side] = (train_step(model), step_tensors(model))
                assert all(model.decoder.layers[i].mlp.shared_experts is not None for i in (0, 1))
    (patched, patched_held), (upstream, upstream_held) = runs["patched"], runs["upstream"]
    caches = {f"shared_experts.{cache}" for cache in SHARED_EXPERT_CACHES}
    assert not any(caches & set(names) for held in (patched_held, upstream_held) for names in held.values())
    assert upstream.held.holders() and patched.held.holders() == []
    _assert_bit_equal(patched, upstream)


@pytest.mark.parametrize("dispatcher", DISPATCHERS)
def test_full_recompute_holds_no_graph_after_backward(moe_cpu, dispatcher):
    """Upstream: every MoE layer's dispatcher holds the recomputed graph, with the layer input and its
    gradient; patched: nothing with autograd history, and less held than upstream without recompute."""
    patched, upstream = _steps(dispatcher, recompute=True)
    with patchkit.applied(PATCH), upstream_behaviour(PATCH):
        plain = train_step(build_moe_gpt(dispatcher, recompute=False)).held
    log.info("%s, full recompute, held after backward: upstream %d tensors / %d B, patched %d / %d B "
             "(upstream without recompute: %d / %d B)", dispatcher, upstream.held.count, upstream.held.bytes,
             patched.held.count, patched.held.bytes, plain.count, plain.bytes)
    assert upstream.held.holders() == [f"decoder.layers.{i}.mlp.{HOLDER[dispatcher]}" for i in (0, 1)]
    assert upstream.held.bytes - plain.bytes >= 2 * 2 * LAYER_INPUT_BYTES  # 2 layers: input and its gradient
    assert patched.held.holders() == []
    assert patched.held.bytes < plain.bytes


@pytest.mark.parametrize("dispatcher", DISPATCHERS)
@pytest.mark.parametrize("recompute", [True, False], ids=["full-recompute", "no-recompute"])
def test_loss_and_gradients_are_bit_equal_to_upstream(moe_cpu, dispatcher, recompute):
    patched, upstream = _steps(dispatcher, recompute=recompute)
    _assert_bit_equal(patched, upstream)


def test_mtp_checkpoints_keep_working_and_release(moe_cpu):
    """verl #7328: MTP layers recomputed (megatron.mtp_recompute) whose saved input aliases the decoder's
    output. The patch frees no storage, it drops a reference: MTP trains exactly as upstream."""
    patched, upstream = _steps("alltoall", recompute=True, mtp_num_layers=1)
    _assert_bit_equal(patched, upstream)
    assert any(name.startswith("mtp.") for name in patched.grads)
    # The MTP layer's own MoE dispatcher held its recomputed graph too (the path differs by release).
    assert any(h.startswith("mtp.layers.0.") and h.endswith(".mlp.token_dispatcher.probs")
               for h in upstream.held.holders())
    assert patched.held.holders() == []


@pytest.mark.parametrize("dispatcher", DISPATCHERS)
def test_next_step_and_forward_without_grad_run_as_upstream(moe_cpu, dispatcher):
    """The dispatcher sets its probs again on every forward: a second step, and a no-grad forward
    (a log-prob pass), give upstream's results after the probs were dropped."""
    with patchkit.applied(PATCH):
        model = build_moe_gpt(dispatcher)
        first, second = train_step(model), train_step(model)
        with torch.no_grad():
            logits = model(*_inputs())
        with upstream_behaviour(PATCH), torch.no_grad():
            expected = model(*_inputs())
    _assert_bit_equal(second, first)
    assert torch.equal(logits, expected)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from tiny_gpt import make_batch

    batch = make_batch()
    return batch.input_ids, batch.position_ids, batch.attention_mask


def test_revert_gives_upstream_back(moe_cpu):
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher, MoEAlltoAllTokenDispatcher

    def installed() -> tuple[object, object]:
        return MoEAlltoAllTokenDispatcher.combine_postprocess, MoEAllGatherTokenDispatcher.combine_postprocess

    originals = installed()
    with patchkit.applied(PATCH):
        assert all(now is not original for now, original in zip(installed(), originals, strict=True))
    assert installed() == originals
