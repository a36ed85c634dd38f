"""Router replay on a tiny MoE GPT (real megatron-core on CPU), through ``patchkit.patches.megatron.router_replay``.

The same tests run on every megatron-core release: 0.14/0.15 through patchkit's backport,
0.16+ through upstream's native replay.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from patchkit.patches.megatron import router_replay as replay
from patchkit.patches.megatron.router_replay._owner import replay_class, replay_module
from replay_models import (
    REPLAY_PATCH_IDS,
    TOPK,
    Batch,
    RoutingCapture,
    build_tiny_moe,
    causal_batch,
    dispatchers,
    forward_loss,
    megatron_version,
    record_then_replay,
    routers,
    shift_expert_bias,
    thd_batch,
)

import patchkit


def test_replay_patch_is_backport_below_016_and_native_from_016(moe_replay):
    status = moe_replay["megatron.router_replay"].to_dict()
    if megatron_version() < (0, 16):
        assert status["state"] == "applied"
    else:
        assert (status["state"], status["reason"]) == ("skipped", "native")
    for patch_id in REPLAY_PATCH_IDS[1:]:
        assert moe_replay[patch_id].to_dict()["state"] == "applied"


def test_every_moe_layer_gets_replay_state(moe_replay):
    model = build_tiny_moe()
    assert len(replay.routers()) == 2
    assert [r.router_replay for r in routers(model)] == replay.routers()


def test_replay_reproduces_recorded_routing_and_loss_after_the_router_changes(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch()
    capture = RoutingCapture(model)

    replay.set_action("record")
    loss_recorded = forward_loss(model, batch)
    maps_recorded = capture.take()
    recorded = [t.clone() for t in replay.recorded()]
    assert [tuple(t.shape) for t in recorded] == [(32, TOPK)] * 2  # seq * batch tokens

    shift_expert_bias(model)
    replay.set_action(None)
    loss_fresh = forward_loss(model, batch)
    maps_fresh = capture.take()
    # The change matters: routed afresh, tokens go elsewhere and the loss moves.
    assert any(not torch.equal(a, b) for a, b in zip(maps_fresh, maps_recorded, strict=True))
    assert not torch.equal(loss_fresh, loss_recorded)

    replay.set_targets(recorded)
    replay.set_action("replay_forward")
    loss_replayed = forward_loss(model, batch)
    maps_replayed = capture.take()
    for replayed_map, recorded_map, indices in zip(maps_replayed, maps_recorded, recorded, strict=True):
        assert torch.equal(replayed_map, recorded_map)
        assert torch.equal(replayed_map.nonzero()[:, 1].view(-1, TOPK), indices.sort(dim=1).values)
    assert torch.equal(loss_replayed, loss_recorded)


def test_replay_keeps_recorded_experts_when_gating_weights_change(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch(seed=11)
    capture = RoutingCapture(model)
    replay.set_action("record")
    forward_loss(model, batch)
    maps_recorded = capture.take()
    replay.set_targets(replay.recorded())

    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for router in routers(model):
            router.weight.add_(torch.randn(router.weight.shape, generator=generator))
    replay.set_action("replay_forward")
    forward_loss(model, batch)
    maps_replayed = capture.take()
    probs_replayed = capture.last_probs
    for replayed_map, recorded_map, probs in zip(maps_replayed, maps_recorded, probs_replayed, strict=True):
        assert torch.equal(replayed_map, recorded_map)
        assert torch.equal(probs != 0, recorded_map)  # weight only on the recorded experts


def test_backward_replay_consumes_each_queued_target_once_during_recompute(moe_replay):
    model = build_tiny_moe(
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    micro_batches = [causal_batch(seed=21), causal_batch(seed=22)]
    params = [p for p in model.parameters() if p.requires_grad]

    def grads_of(batch: Batch, backward_action):
        model.zero_grad(set_to_none=True)
        loss = forward_loss(model, batch).sum()
        replay.set_action(backward_action)
        loss.backward()
        return [p.grad.clone() if p.grad is not None else None for p in params]

    # Reference: the recorded passes themselves (recompute re-records the same routing).
    recorded, reference = [], []
    for batch in micro_batches:
        replay.set_action("record")
        reference.append(grads_of(batch, "record"))
        recorded.append([t.clone() for t in replay.recorded()])

    shift_expert_bias(model)

    # Pipeline order: forward every micro-batch, then their backwards in the same order.
    losses = []
    for targets, batch in zip(recorded, micro_batches, strict=True):
        replay.set_targets(targets)
        replay.set_action("replay_forward")
        model.zero_grad(set_to_none=True)
        losses.append(forward_loss(model, batch).sum())
    assert replay.pending_backward() == [2, 2]

    replay.set_action("replay_backward")
    for done, (loss, want) in enumerate(zip(losses, reference, strict=True), start=1):
        model.zero_grad(set_to_none=True)
        loss.backward()
        assert replay.pending_backward() == [2 - done] * 2
        for got_grad, want_grad in zip([p.grad for p in params], want, strict=True):
            assert (got_grad is None) == (want_grad is None)
            if got_grad is not None:
                torch.testing.assert_close(got_grad, want_grad, rtol=0, atol=0)

    # Nothing left to replay: a typed error, not "pop from empty list".
    replay.set_action("replay_forward")
    loss = forward_loss(model, micro_batches[0]).sum()
    replay.set_action("replay_backward")
    with pytest.raises(replay.ReplayTargetMissingError, match="MoE layer 1.*replay_backward"):
        loss.backward()


def test_recompute_without_backward_replay_routes_differently(moe_replay):
    """The check above can fail: recomputing with fresh routing changes the gradients."""
    model = build_tiny_moe(
        recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    reference, got = record_then_replay(model, causal_batch(seed=21), backward_action=None)  # recompute routes afresh
    assert any(not torch.equal(a, b) for a, b in zip(got, reference, strict=True))


def test_target_with_wrong_token_count_raises_naming_both_counts_and_layer(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch()
    replay.set_action("record")
    forward_loss(model, batch)
    recorded = replay.recorded()

    replay.set_targets([t[:-1] for t in recorded])
    replay.set_action("replay_forward")
    with pytest.raises(replay.ReplayIndexMismatchError) as caught:
        forward_loss(model, batch)
    error = caught.value
    assert (error.layer, error.expected_tokens, error.got_tokens) == (0, 32, 31)
    assert "MoE layer 0" in str(error) and "32 tokens" in str(error) and "has 31" in str(error)
    assert isinstance(error, ValueError)


def test_target_with_wrong_topk_raises(moe_replay):
    model = build_tiny_moe()
    replay.set_targets([torch.zeros(32, TOPK + 1, dtype=torch.long)] * 2)
    replay.set_action("replay_forward")
    with pytest.raises(replay.ReplayIndexMismatchError, match=r"expected \[32, 2\]"):
        forward_loss(model, causal_batch())


def test_targets_for_the_wrong_number_of_layers_are_refused(moe_replay):
    build_tiny_moe()
    with pytest.raises(replay.RouterReplayError, match="indices for 3 MoE layers but the model has 2"):
        replay.set_targets([torch.zeros(32, TOPK, dtype=torch.long)] * 3)


def test_replay_without_any_enabled_router_is_a_clear_error(moe_replay):
    with pytest.raises(replay.RouterReplayUnavailableError, match="enable"):
        replay.set_action("record")
    with pytest.raises(replay.RouterReplayError, match="unknown router replay action"):
        build_tiny_moe()
        replay.set_action("replay")


def test_fp8_packed_round_trip_replays_the_recorded_pass(moe_replay):
    lengths, seq_len = [5, 11, 3], 12
    fp8_config = types.SimpleNamespace(fp8="e4m3", tensor_model_parallel_size=1)
    layout = replay.thd_layout(lengths, seq_len=seq_len, config=fp8_config)
    assert layout.total_tokens == 128  # 16 + 16 + 16 -> 128 on the last sample

    model = build_tiny_moe(max_sequence_length=128)
    generator = torch.Generator().manual_seed(1)
    per_sample_ids = torch.randint(1, 128, (3, seq_len), generator=generator)
    batch = thd_batch(layout, per_sample_ids)

    capture = RoutingCapture(model)
    replay.set_action("record")
    loss_recorded = forward_loss(model, batch)
    maps_recorded = capture.take()
    # The rollout side's view: [batch, seq, layers, topk] per sample, padding dropped.
    per_sample = replay.unpack(torch.stack(replay.recorded(), dim=1), layout)
    assert per_sample.shape == (3, seq_len, 2, TOPK)

    shift_expert_bias(model)
    replay.clear()
    replay.set_targets(replay.pack(per_sample, layout))
    replay.set_action("replay_forward")
    loss_replayed = forward_loss(model, batch)
    maps_replayed = capture.take()

    token_cells = torch.arange(seq_len) < torch.tensor(lengths)[:, None]
    valid = torch.zeros(layout.total_tokens, dtype=torch.bool)
    valid[layout.slot_of_cell.view(3, seq_len)[token_cells]] = True
    for replayed_map, recorded_map in zip(maps_replayed, maps_recorded, strict=True):
        assert torch.equal(replayed_map[valid], recorded_map[valid])
    # Padding slots now replay experts 0..topk-1 instead of what they happened to pick, so the
    # experts multiply differently sized batches: equal up to float rounding, not bit for bit.
    torch.testing.assert_close(loss_replayed[0, valid], loss_recorded[0, valid], rtol=1e-6, atol=1e-6)


def test_targets_packed_without_fp8_padding_for_an_fp8_input_raise_a_mismatch(moe_replay):
    lengths, seq_len = [5, 11, 3], 12
    fp8_layout = replay.thd_layout(lengths, seq_len=seq_len, fp8_padding=True)
    plain_layout = replay.thd_layout(lengths, seq_len=seq_len, config=types.SimpleNamespace())
    model = build_tiny_moe(max_sequence_length=128)
    batch = thd_batch(fp8_layout, torch.ones(3, seq_len, dtype=torch.long))

    per_sample = torch.zeros(3, seq_len, 2, TOPK, dtype=torch.long)
    per_sample[..., 1] = 1
    replay.set_targets(replay.pack(per_sample, plain_layout))  # the bug: padding ignored
    replay.set_action("replay_forward")
    with pytest.raises(replay.ReplayIndexMismatchError, match="sees 128 tokens .* has 19"):
        forward_loss(model, batch)


def test_alltoall_counts_the_rows_a_duplicate_replay_really_routes(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch()
    duplicate = torch.zeros(32, TOPK, dtype=torch.long)  # every token: expert 0 twice
    capture = RoutingCapture(model)

    replay.set_targets([duplicate, duplicate])
    replay.set_action("replay_forward")
    forward_loss(model, batch)
    maps = capture.take()
    assert len(maps) == len(dispatchers(model)) == 2
    for dispatcher, routing_map in zip(dispatchers(model), maps, strict=True):
        assert int(routing_map.sum()) == 32  # one row per token, not topk
        assert int(dispatcher.num_out_tokens) == 32

    # Outside replay the static count (tokens * topk) is upstream's and stays.
    replay.set_action(None)
    forward_loss(model, batch)
    assert [dispatcher.num_out_tokens for dispatcher in dispatchers(model)] == [32 * TOPK] * 2


def test_alltoall_static_count_breaks_on_duplicates_without_the_patch(moe_replay):
    """What the patch fixes, on upstream's code: the count overstates the routed rows.

    Where the unfused permute is argsort-based and takes ``num_out_tokens`` rows (0.19.2), the
    expert split fails outright; where it uses ``masked_select`` (0.14-0.16) only the fused TE
    permute reads the count, so on CPU the overstated count is what can be observed.
    """
    patchkit.revert("megatron.moe_alltoall_replay_token_count")
    model = build_tiny_moe()
    duplicate = torch.zeros(32, TOPK, dtype=torch.long)
    replay.set_targets([duplicate, duplicate])
    replay.set_action("replay_forward")
    try:
        forward_loss(model, causal_batch())
    except RuntimeError as exc:
        assert "split" in str(exc) and "64" in str(exc)
    else:
        assert [dispatcher.num_out_tokens for dispatcher in dispatchers(model)] == [32 * TOPK] * 2


def test_apply_all_before_megatron_import_installs_replay_and_its_check_on_import():
    """The process-start path: patches wait for the router module, then install in id order."""
    script = textwrap.dedent(
        """
        import json, patchkit
        patchkit.apply_all()
        import megatron.core.transformer.moe.router as router
        states = {s.id: s.to_dict()["state"] for s in patchkit.status("megatron.*")}
        wrapped = hasattr(router.RouterReplay.get_replay_topk, "__wrapped__")
        print(json.dumps({"states": states, "wrapped": wrapped}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = "applied" if megatron_version() < (0, 16) else "skipped"
    assert result["states"]["megatron.router_replay"] == expected
    assert result["states"]["megatron.router_replay_validation"] == "applied"
    assert result["wrapped"]


ROUTING_CASES = {
    "softmax": dict(score_function="softmax"),
    "softmax-pre": dict(score_function="softmax", use_pre_softmax=True),
    "softmax-scaled": dict(score_function="softmax", scaling_factor=2.5),
    "sigmoid": dict(score_function="sigmoid"),
    "sigmoid-bias": dict(score_function="sigmoid", expert_bias=torch.linspace(-0.3, 0.3, 8)),
    "group-limited": dict(score_function="softmax", use_pre_softmax=True, num_groups=4, group_topk=2),
}


@pytest.mark.parametrize("case", list(ROUTING_CASES))
def test_record_and_replay_of_the_same_indices_equal_upstream_routing(moe_replay, case):
    """Whichever implementation replays (backport or native), its probs are upstream's."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe import router as router_module

    kwargs = ROUTING_CASES[case]
    logits = torch.randn(24, 8, generator=torch.Generator().manual_seed(4))
    want_probs, want_map = moe_utils.topk_routing_with_score_function(logits, 3, **kwargs)

    state = replay_class()()
    state.set_router_replay_action(replay_module().RouterReplayAction("record"))
    probs, routing_map = router_module.topk_routing_with_score_function(logits, 3, router_replay=state, **kwargs)
    assert torch.equal(probs, want_probs) and torch.equal(routing_map, want_map)

    state.set_target_indices(state.get_recorded_indices())
    state.set_router_replay_action(replay_module().RouterReplayAction("replay_forward"))
    probs, routing_map = router_module.topk_routing_with_score_function(logits, 3, router_replay=state, **kwargs)
    assert torch.equal(routing_map, want_map)
    torch.testing.assert_close(probs, want_probs, rtol=0, atol=0)


def test_backport_refuses_replay_on_the_fused_topk_path(moe_replay):
    if megatron_version() >= (0, 16):
        pytest.skip("native replay: upstream's fused path is upstream's behaviour")
    from megatron.core.transformer.moe import router as router_module

    state = replay_class()()
    state.set_router_replay_action(replay_module().RouterReplayAction("replay_forward"))
    with pytest.raises(replay.RouterReplayError, match="moe_router_fusion=False"):
        router_module.topk_routing_with_score_function(torch.randn(4, 8), 2, fused=True, router_replay=state)
