"""Router replay and THD packing on a CUDA GPU: no CPU harness, an NCCL world of one.

Run on a GPU machine with ``-m gpu``; skipped cleanly elsewhere. Besides the CPU checks on CUDA
tensors, this is where "at most one host sync" is measured: CUDA's sync debug mode warns on every
synchronizing call.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator

import pytest
import torch
from patchkit.patches.megatron import router_replay as replay
from replay_models import (
    REPLAY_PATCH_IDS,
    TOPK,
    Batch,
    RoutingCapture,
    build_tiny_moe,
    causal_batch,
    forward_loss,
    record_then_replay,
    shift_expert_bias,
)

import patchkit

pytestmark = pytest.mark.gpu

@pytest.fixture
def cuda() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.cuda.set_device(0)
    return torch.device("cuda", 0)


@pytest.fixture
def moe_replay_gpu(cuda: torch.device, megatron_gpu: None) -> Iterator[torch.device]:
    with patchkit.applied(*REPLAY_PATCH_IDS):
        replay.reset()
        yield cuda
        replay.reset()


def _on(batch: Batch, device: torch.device) -> Batch:
    return Batch(**{f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(Batch)})


def _count_syncs(fn):
    """Run ``fn`` with CUDA's sync debug mode on; return its result and the syncs it made."""
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    # Only real syncs: PyTorch also warns once that the debug mode "does not yet detect all
    # synchronizing operations", which must not count as one.
    syncs = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    return result, len(syncs)


@pytest.mark.parametrize(("tp", "cp", "fp8"), [(1, 1, True), (2, 1, False), (4, 2, True)])
def test_gpu_layout_syncs_once_and_pack_unpack_never(cuda, tp, cp, fp8):
    generator = torch.Generator().manual_seed(tp + cp)
    lengths = torch.randint(1, 300, (16,), generator=generator)
    mask = (torch.arange(320) < lengths.unsqueeze(1)).to(cuda)
    per_sample = torch.randint(0, 64, (16, 320, 4, TOPK), generator=generator).to(cuda)

    layout, layout_syncs = _count_syncs(
        lambda: replay.thd_layout(mask, tp_size=tp, cp_size=cp, fp8_padding=fp8)
    )
    ranks, pack_syncs = _count_syncs(
        lambda: [replay.pack(per_sample, layout, cp_rank=r) for r in range(cp)]
    )
    back, unpack_syncs = _count_syncs(lambda: replay.unpack(ranks, layout))
    assert layout_syncs <= 1 and pack_syncs == 0 and unpack_syncs == 0

    cpu_layout = replay.thd_layout(mask.cpu(), tp_size=tp, cp_size=cp, fp8_padding=fp8)
    for rank, packed in enumerate(ranks):
        assert torch.equal(packed.cpu(), replay.pack(per_sample.cpu(), cpu_layout, cp_rank=rank))
    assert torch.equal(back.cpu()[mask.cpu()], per_sample.cpu()[mask.cpu()])


def test_gpu_replay_reproduces_recorded_routing_and_loss(moe_replay_gpu):
    device = moe_replay_gpu
    model = build_tiny_moe().to(device)
    batch = _on(causal_batch(), device)
    capture = RoutingCapture(model)

    replay.set_action("record")
    loss_recorded = forward_loss(model, batch)
    maps_recorded = capture.take()
    recorded = [t.clone() for t in replay.recorded()]

    shift_expert_bias(model)
    replay.set_action(None)
    loss_fresh = forward_loss(model, batch)
    assert any(not torch.equal(a, b) for a, b in zip(capture.take(), maps_recorded, strict=True))
    assert not torch.equal(loss_fresh, loss_recorded)

    replay.set_targets(recorded)
    replay.set_action("replay_forward")
    loss_replayed = forward_loss(model, batch)
    for replayed_map, recorded_map in zip(capture.take(), maps_recorded, strict=True):
        assert torch.equal(replayed_map, recorded_map)
    assert torch.equal(loss_replayed, loss_recorded)


def test_gpu_backward_replay_consumes_each_target_once(moe_replay_gpu):
    device = moe_replay_gpu
    model = build_tiny_moe(
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    ).to(device)
    reference, got = record_then_replay(model, _on(causal_batch(seed=21), device), backward_action="replay_backward")
    assert replay.pending_backward() == [0, 0]
    for a, b in zip(got, reference, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gpu_mismatched_target_raises_naming_both_counts(moe_replay_gpu):
    device = moe_replay_gpu
    model = build_tiny_moe().to(device)
    batch = _on(causal_batch(), device)
    replay.set_targets([torch.zeros(31, TOPK, dtype=torch.long, device=device)] * 2)
    replay.set_action("replay_forward")
    with pytest.raises(replay.ReplayIndexMismatchError, match="MoE layer 0.*sees 32 tokens.*has 31"):
        forward_loss(model, batch)


def test_gpu_duplicate_replay_routes_with_an_exact_token_count(moe_replay_gpu):
    device = moe_replay_gpu
    model = build_tiny_moe().to(device)
    duplicate = torch.zeros(32, TOPK, dtype=torch.long, device=device)
    replay.set_targets([duplicate, duplicate])
    replay.set_action("replay_forward")
    loss = forward_loss(model, _on(causal_batch(), device))
    assert torch.isfinite(loss).all()
