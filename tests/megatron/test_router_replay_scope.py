"""Router replay as RL frameworks drive it today.

Real megatron-core on CPU (``moe_harness``), every release through the same API: model-scoped
control keyed by layer number (hybrid dense/MoE stacks, MTP routers), missing-target and
invalid-row policies with visible fallback counts, padding rows spread over experts, coexistence
with another framework's replay patch, jagged (nested) tensors.
"""

from __future__ import annotations

import functools

import pytest
import torch
from patchkit.patches.megatron import router_replay as replay
from replay_models import (
    NUM_EXPERTS,
    TOPK,
    Batch,
    RoutingCapture,
    build_tiny_moe,
    causal_batch,
    dispatchers,
    forward_loss,
    megatron_version,
    routers,
    shift_expert_bias,
)


def _record_then_shift(model, batch: Batch, scope) -> tuple[dict, list]:
    capture = RoutingCapture(model)
    scope.set_action("record")
    forward_loss(model, batch)
    maps = capture.take()
    capture.remove()
    recorded = {key: value.clone() for key, value in scope.recorded().items()}
    shift_expert_bias(model)
    scope.clear()
    return recorded, maps


def _replayed_maps(model, batch: Batch) -> list:
    capture = RoutingCapture(model)
    forward_loss(model, batch)
    maps = capture.take()
    capture.remove()
    return maps


# --- 1. model-scoped, keyed by layer number ----------------------------------------------------


def test_model_scope_drives_only_its_own_routers_while_stale_ones_exist(moe_replay):
    stale = build_tiny_moe(seed=1)  # a reference model, or a decoder since rebuilt
    model = build_tiny_moe(seed=2)
    assert len(replay.routers()) == 4  # the process-wide registry holds both
    with pytest.raises(replay.RouterReplayError, match="2 MoE layers but the model has 4"):
        replay.set_targets([torch.zeros(32, TOPK, dtype=torch.long)] * 2)

    scope = replay.for_model(model)
    assert scope.layers == (1, 2)
    batch = causal_batch()
    recorded, maps = _record_then_shift(model, batch, scope)
    assert all(r.router_replay.recorded_topk_idx is None for r in routers(stale))
    scope.set_targets(recorded)
    scope.set_action("replay_forward")
    assert all(r.router_replay.router_replay_action is None for r in routers(stale))
    for got, want in zip(_replayed_maps(model, batch), maps, strict=True):
        assert torch.equal(got, want)
    assert scope.pending_backward() == {1: 1, 2: 1}


def test_hybrid_stack_keys_moe_layers_by_number_in_every_target_form(moe_replay):
    model = build_tiny_moe(num_layers=4, moe_layer_freq=[1, 0, 1, 1])
    scope = replay.for_model(model)
    assert scope.layers == (1, 3, 4)
    assert replay.moe_layer_numbers(model.config) == [1, 3, 4]
    batch = causal_batch()
    recorded, maps = _record_then_shift(model, batch, scope)
    _, stacked = replay.stack_layers(recorded)  # [tokens, 3 MoE layers, topk]: the R2 form
    all_layers = torch.zeros(32, 4, TOPK, dtype=torch.long)  # [tokens, num_layers, topk]: R3
    all_layers[:, [0, 2, 3]] = stacked
    for form in (recorded, stacked, all_layers):
        scope.clear()
        scope.set_targets(form)
        scope.set_action("replay_forward")
        for got, want in zip(_replayed_maps(model, batch), maps, strict=True):
            assert torch.equal(got, want)
    with pytest.raises(replay.RouterReplayError, match="got indices for 2 layers"):
        scope.set_targets(stacked[:, :2])


def test_mtp_routers_are_keyed_apart_from_the_backbone_layers_they_alias(moe_replay):
    model = build_tiny_moe(mtp_num_layers=1, mtp_loss_scaling_factor=0.1)
    by_name = {name: module for name, module in model.named_modules() if name.endswith("router")}
    mtp_router = next(module for name, module in by_name.items() if name.startswith("mtp."))
    decoder_numbers = {module.layer_number for name, module in by_name.items() if name.startswith("decoder.")}
    # Releases differ: 0.16.1 numbers the MTP layer after the decoder (3), 0.19.2 from 1 again, which
    # aliases decoder layer 1 (Megatron-LM #7404). The "mtp.<depth>" key is the same on both.
    assert isinstance(mtp_router.layer_number, int) and decoder_numbers == {1, 2}

    scope = replay.for_model(model)
    assert scope.layers == (1, 2, "mtp.1")
    batch = causal_batch()
    capture = RoutingCapture(model)
    scope.set_action("record")
    forward_loss(model, batch)
    maps = capture.take()
    recorded = {key: value.clone() for key, value in scope.recorded().items()}
    shift_expert_bias(model)
    scope.clear()
    with pytest.raises(replay.RouterReplayError, match=r"no target for layers \['mtp.1'\]"):
        scope.set_targets({1: recorded[1], 2: recorded[2]})
    assert scope.pending_backward() == {1: 0, 2: 0, "mtp.1": 0}  # nothing half-set
    scope.set_targets(recorded)
    scope.set_action("replay_forward")
    forward_loss(model, batch)
    for got, want in zip(capture.take(), maps, strict=True):
        assert torch.equal(got, want)

    # Backbone-only replay (verl's choice): the MTP router is not driven and routes itself.
    backbone = replay.for_model(model, include_mtp=False)
    scope.clear()
    backbone.set_targets({1: recorded[1], 2: recorded[2], "mtp.1": recorded["mtp.1"]})
    backbone.set_action("replay_forward")
    forward_loss(model, batch)
    assert mtp_router.router_replay.router_replay_action is None


def test_excluded_mtp_layers_route_themselves_while_the_decoder_replays(moe_replay):
    model = build_tiny_moe(mtp_num_layers=1, mtp_loss_scaling_factor=0.1)
    mtp_router = next(module for name, module in model.named_modules() if name.startswith("mtp.")
                      and name.endswith("router"))
    assert replay.exclude_mtp(model) == ["mtp.1"]
    assert mtp_router.router_replay is None
    assert len(replay.routers()) == 2  # the process-wide calls see the decoder's MoE layers only
    assert replay.for_model(model).layers == (1, 2)

    batch = causal_batch()
    capture = RoutingCapture(model)
    replay.set_action("record")
    forward_loss(model, batch)
    recorded_maps = capture.take()  # decoder 1, decoder 2, MTP
    recorded = [t.clone() for t in replay.recorded()]
    assert [tuple(t.shape) for t in recorded] == [(32, TOPK)] * 2

    shift_expert_bias(model)
    replay.set_targets(recorded)  # two layers, as the rollout engine records them
    replay.set_action("replay_forward")
    forward_loss(model, batch)
    replayed_maps = capture.take()
    assert all(torch.equal(got, want) for got, want in zip(replayed_maps[:2], recorded_maps[:2], strict=True))
    assert not torch.equal(replayed_maps[2], recorded_maps[2])  # the MTP router chose afresh


def test_model_scope_of_virtual_pipeline_chunks_refuses_two_routers_for_one_layer(moe_replay):
    one, two = build_tiny_moe(seed=1), build_tiny_moe(seed=2)
    with pytest.raises(replay.RouterReplayError, match="both claim layer 1"):
        replay.for_model([one, two])


# --- 3. missing target policy ------------------------------------------------------------------


def test_missing_target_raises_by_default_and_falls_back_visibly_when_asked(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch()
    scope = replay.for_model(model)
    assert replay.policy() == {"on_missing": "raise", "on_invalid": "raise"}
    scope.set_action("replay_forward")
    with pytest.raises(replay.ReplayTargetMissingError, match="MoE layer 1"):
        forward_loss(model, batch)

    scope.set_action(None)
    fresh = _replayed_maps(model, batch)
    replay.set_policy(on_missing="native")
    scope.set_action("replay_forward")
    for got, want in zip(_replayed_maps(model, batch), fresh, strict=True):
        assert torch.equal(got, want)
    assert scope.fallbacks() == {1: {"missing": 1, "invalid_rows": 0}, 2: {"missing": 1, "invalid_rows": 0}}
    assert replay.fallbacks() == [{"missing": 1, "invalid_rows": 0}] * 2

    # A model's own policy wins over the process default.
    scope.set_policy(on_missing="raise")
    with pytest.raises(replay.ReplayTargetMissingError):
        forward_loss(model, batch)


# --- 5. sentinel and out-of-range rows -------------------------------------------------------


def _targets_with_bad_rows(scope, model, batch, bad_rows, value):
    scope.set_action("record")
    forward_loss(model, batch)
    recorded = {key: value_.clone() for key, value_ in scope.recorded().items()}
    scope.clear()
    recorded[1][bad_rows, 0] = value
    return recorded


@pytest.mark.parametrize("value", [-1, NUM_EXPERTS])
def test_sentinel_rows_raise_naming_layer_and_count(moe_replay, value):
    model = build_tiny_moe()
    batch = causal_batch()
    scope = replay.for_model(model)
    targets = _targets_with_bad_rows(scope, model, batch, [3, 5, 9], value)
    scope.set_targets(targets)
    scope.set_action("replay_forward")
    with pytest.raises(replay.ReplayIndexInvalidError, match=r"MoE layer 1 \(replay_forward\): 3 of 32") as caught:
        forward_loss(model, batch)
    assert (caught.value.layer, caught.value.rows, caught.value.num_experts) == (1, 3, NUM_EXPERTS)


def test_sentinel_rows_take_the_routers_own_choice_under_the_native_policy(moe_replay):
    model = build_tiny_moe()
    batch = causal_batch()
    scope = replay.for_model(model)
    bad = [3, 5, 9]
    targets = _targets_with_bad_rows(scope, model, batch, bad, -1)
    shift_expert_bias(model)
    scope.set_action(None)
    fresh = _replayed_maps(model, batch)
    scope.set_policy(on_invalid="native")
    scope.set_targets(targets)
    scope.set_action("replay_forward")
    got = _replayed_maps(model, batch)
    good = torch.ones(32, dtype=torch.bool)
    good[bad] = False
    for layer, (got_map, fresh_map) in enumerate(zip(got, fresh, strict=True), start=1):
        want = torch.zeros_like(got_map).scatter(1, targets[layer].clamp(min=0), True)
        assert torch.equal(got_map[good], want[good])
        if layer == 1:
            assert torch.equal(got_map[bad], fresh_map[bad])  # the router's own choice
    assert scope.fallbacks()[1] == {"missing": 0, "invalid_rows": 3}
    assert scope.fallbacks()[2] == {"missing": 0, "invalid_rows": 0}
    # The stored target is untouched: a later pass decides afresh for those rows.
    assert int((scope.replay_state(1).target_topk_idx < 0).sum()) == 3


# --- 4. padding rows ---------------------------------------------------------------------------


def _expert_load(indices: torch.Tensor) -> torch.Tensor:
    return torch.bincount(indices.flatten(), minlength=NUM_EXPERTS)


def test_padding_rows_spread_over_experts_and_ep_ranks(moe_replay):
    lengths, seq_len = [5, 11, 3, 1], 12
    layout = replay.thd_layout(lengths, seq_len=seq_len, fp8_padding=True, num_experts=NUM_EXPERTS)
    padding = layout.padding_mask()
    assert int(padding.sum()) == 128 - sum(lengths) == 108
    per_sample = torch.randint(0, NUM_EXPERTS, (4, seq_len, 2, TOPK))
    packed = replay.pack(per_sample, layout)
    load = _expert_load(packed[padding])
    # 108 rows x 2 layers x top-2 = 432 slots over 8 experts: 54 each, both EP ranks (4 experts each) half.
    assert load.tolist() == [54] * NUM_EXPERTS
    assert int(load[:4].sum()) == int(load[4:].sum())
    assert all(len(set(row.tolist())) == TOPK for row in packed[padding].flatten(0, 1))

    # Replayed through the model: the routers' load from padding rows is spread as well.
    model = build_tiny_moe(max_sequence_length=128)
    ids = replay.pack(torch.ones(4, seq_len, 1, dtype=torch.long), layout, fill=0).view(1, -1)
    batch = Batch(ids, torch.arange(128).view(1, -1), torch.ones(128, 128, dtype=torch.bool).triu(1)[None, None], ids)
    scope = replay.for_model(model)
    scope.set_targets(packed)
    scope.set_action("replay_forward")
    maps = _replayed_maps(model, batch)
    padded_load = maps[0][padding].sum(dim=0)
    assert padded_load.tolist() == [27] * NUM_EXPERTS


def test_padding_rows_default_to_distinct_experts_when_the_expert_count_is_unknown(moe_replay):
    layout = replay.thd_layout([3], seq_len=4, tp_size=4)
    packed = replay.pack(torch.full((1, 4, 1, TOPK), 5), layout)
    assert packed[3].tolist() == [[0, 1]]
    with pytest.raises(ValueError, match="needs the number of experts"):
        replay.pack(torch.full((1, 4, 1, TOPK), 5), layout, fill="spread")


def test_padding_mask_matches_the_thd_input_and_upstream_expert_bias_cannot_take_it(moe_replay):
    if megatron_version() < (0, 16):
        pytest.skip("GPTModel.forward takes padding_mask from megatron-core 0.16")
    lengths, seq_len = [5, 11], 12
    layout = replay.thd_layout(lengths, seq_len=seq_len, tp_size=8, num_experts=NUM_EXPERTS)
    total = layout.total_tokens
    model = build_tiny_moe(max_sequence_length=total)
    ids = replay.pack(torch.ones(2, seq_len, 1, dtype=torch.long), layout, fill=0).view(1, -1)
    mask = torch.ones(total, total, dtype=torch.bool).triu(1)[None, None]

    def counted(**kwargs) -> int:
        for router in routers(model):
            router.local_tokens_per_expert.zero_()
        model(ids, torch.arange(total).view(1, -1), mask, labels=ids, **kwargs)
        return int(routers(model)[0].local_tokens_per_expert.sum())

    assert counted() == total * TOPK
    padding_mask = layout.padding_mask().view(1, -1)
    if megatron_version() >= (0, 20):
        # main (0.20.0) masks correctly: padding rows leave the expert-bias counts.
        assert counted(padding_mask=padding_mask) == sum(lengths) * TOPK
        return
    # megatron-core 0.16.1-0.19.2 compute `routing_map & ~padding_mask` with a [tokens, experts] map
    # and a [tokens] mask: it fails to broadcast whenever tokens != experts, so upstream's own
    # padding_mask cannot be used with expert bias there. Recorded as an upstream bug.
    with pytest.raises(RuntimeError, match="broadcast|size of tensor"):
        counted(padding_mask=padding_mask)


# --- 6. coexistence with another framework's replay patch -------------------------------------


class ForeignRouterReplay:
    """The facts of verl's replay class: ``router_instances`` and no ``global_router_replay_instances``;
    with ``REPLAY_FORWARD`` and no target it routes natively."""

    router_instances: list = []

    def __init__(self) -> None:
        self.target_topk_idx = None
        self.recorded_topk_idx = None
        self.router_replay_action = None
        self.replay_backward_list: list = []
        ForeignRouterReplay.router_instances.append(self)

    def set_router_replay_action(self, action) -> None:
        self.router_replay_action = action

    def clear_router_replay_action(self) -> None:
        self.router_replay_action = None

    def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
        value = getattr(self.router_replay_action, "value", None)
        if value == "replay_forward" and self.target_topk_idx is not None:
            indices = self.target_topk_idx.to(scores.device)
            return scores.gather(1, indices), indices
        if value == "record":
            probs, indices = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            self.recorded_topk_idx = indices
            return probs, indices
        return default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)


@pytest.fixture
def foreign_patched_init(monkeypatch):
    """verl's ``patched_init``: after the original ``__init__``, ``self.router_replay`` is its own."""
    from megatron.core.transformer.moe.router import TopKRouter

    original = TopKRouter.__init__

    @functools.wraps(original)
    def patched_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.router_replay = ForeignRouterReplay()

    ForeignRouterReplay.router_instances = []
    monkeypatch.setattr(TopKRouter, "__init__", patched_init)
    monkeypatch.setattr(TopKRouter, "_router_replay_patched", True, raising=False)


def test_foreign_patched_init_is_detected_and_the_api_stands_aside(moe_replay, foreign_patched_init):
    model = build_tiny_moe()
    owner = replay.ownership(model)
    assert owner.owner == "foreign" and "ForeignRouterReplay" in owner.detail
    assert replay.ownership().owner == "foreign"
    with pytest.raises(replay.RouterReplayConflictError, match="stands aside"):
        replay.set_action("record")
    with pytest.raises(replay.RouterReplayConflictError):
        replay.for_model(model)
    # The framework's own replay still runs through the (patched) model untouched.
    action = type("A", (), {"value": "record"})()
    for router in routers(model):
        router.router_replay.set_router_replay_action(action)
    forward_loss(model, causal_batch())
    if megatron_version() >= (0, 16):
        assert all(r.router_replay.recorded_topk_idx is not None for r in routers(model))


def test_foreign_replay_class_in_the_router_module_never_breaks_the_alltoall_preprocess(moe_replay, monkeypatch):
    from megatron.core.transformer.moe import router as router_module

    model = build_tiny_moe()
    ForeignRouterReplay.router_instances = []
    stuck = ForeignRouterReplay()
    stuck.set_router_replay_action(type("A", (), {"value": "replay_forward"})())
    monkeypatch.setattr(router_module, "RouterReplay", ForeignRouterReplay)  # verl's DeepSeek-V4 path
    loss = forward_loss(model, causal_batch())  # the dispatcher's preprocess reads the registry
    assert torch.isfinite(loss).all()
    assert replay.ownership().owner == "foreign"


class _ForeignAction:
    """A framework's own action enum member: only its ``value`` is shared with upstream's."""

    def __init__(self, value: str) -> None:
        self.value = value


@pytest.fixture
def foreign_init_and_routing(monkeypatch, foreign_patched_init):
    """A framework's whole replay (verl's V12 shape): its own ``__init__`` (above) and its own
    ``TopKRouter.routing``, which replays through its own state; the router module's
    ``RouterReplay`` stays upstream's (or patchkit's backport), whose registry stays idle."""
    from megatron.core.transformer.moe.router import TopKRouter

    def own_routing(self, logits, *args, **kwargs):
        logits = logits.view(-1, self.config.num_moe_experts)
        scores = torch.sigmoid(logits.float()).type_as(logits)
        _, indices = self.router_replay.get_replay_topk(
            scores, self.topk, default_compute_topk=lambda s, k, **_: torch.topk(s, k=k, dim=1))
        probs = torch.zeros_like(logits).scatter(1, indices, scores.gather(1, indices))
        return probs, torch.zeros_like(logits, dtype=torch.bool).scatter(1, indices, True)

    monkeypatch.setattr(TopKRouter, "routing", own_routing)


def _foreign_duplicate_replay(model) -> None:
    for router in routers(model):
        router.router_replay.target_topk_idx = torch.zeros(32, TOPK, dtype=torch.long)  # expert 0 twice
        router.router_replay.set_router_replay_action(_ForeignAction("replay_forward"))


def test_alltoall_counts_the_rows_a_framework_replay_class_routes(moe_replay, foreign_init_and_routing):
    """The framework keeps its own replay class and routing; patchkit's token count alone fixes the
    dispatcher (the framework's own preprocess patch can go)."""
    from patchkit.patches.megatron.router_replay._owner import process_routers

    model = build_tiny_moe()
    assert not any(r.router_replay_action for r in process_routers())  # no registry says "replaying"
    _foreign_duplicate_replay(model)
    capture = RoutingCapture(model)
    loss = forward_loss(model, causal_batch())
    assert [int(m.sum()) for m in capture.take()] == [32, 32]
    assert [int(d.num_out_tokens) for d in dispatchers(model)] == [32, 32]
    assert torch.isfinite(loss).all()

    # Recording (not replaying) keeps upstream's static count: no earlier host sync.
    for router in routers(model):
        router.router_replay.set_router_replay_action(_ForeignAction("record"))
    forward_loss(model, causal_batch())
    assert [d.num_out_tokens for d in dispatchers(model)] == [32 * TOPK] * 2


@pytest.mark.breaks("megatron.moe_alltoall_replay_token_count")
def test_framework_replay_class_gets_upstreams_static_count_without_the_router_mark(
    moe_replay, foreign_init_and_routing
):
    """Without the router's mark (upstream's ``TopKRouter.forward``) only the registries are read,
    and a framework's class is in none: 64 rows claimed for 32 (0.14-0.16), the expert split fails
    (0.19.2)."""
    from patchkit.runtime.process_engine import engine

    (mark,) = [a for a in engine().installed_actions("megatron.moe_alltoall_replay_token_count")
               if a.name == "forward"]
    model = build_tiny_moe()
    _foreign_duplicate_replay(model)
    mark.restore()
    try:
        forward_loss(model, causal_batch())
    except RuntimeError as exc:
        assert "split" in str(exc) and "64" in str(exc)
    else:
        assert [int(d.num_out_tokens) for d in dispatchers(model)] == [32 * TOPK] * 2
    finally:
        setattr(mark.owner, mark.name, mark.installed)


def test_validation_wrapper_stands_aside_for_a_foreign_class_it_wrapped(moe_replay):
    from patchkit.patches.megatron.router_replay._router_replay_validation import wrap_get_replay_topk

    wrapped = wrap_get_replay_topk(ForeignRouterReplay.get_replay_topk)
    ForeignRouterReplay.router_instances = []
    state = ForeignRouterReplay()
    state.set_router_replay_action(type("A", (), {"value": "replay_forward"})())
    scores = torch.randn(4, NUM_EXPERTS)
    _, indices = wrapped(state, scores, TOPK, None, None, lambda s, k, num_groups=None, group_topk=None: s.topk(k))
    assert torch.equal(indices, scores.topk(TOPK).indices)  # the framework's fallback, not our error


# --- 7. nested (jagged) tensors ----------------------------------------------------------------


def test_nested_jagged_tensors_pack_unpack_and_replay_like_the_padded_form(moe_replay):
    lengths = [5, 11, 3]
    generator = torch.Generator().manual_seed(3)
    samples = [torch.randint(1, 128, (n,), generator=generator) for n in lengths]
    input_ids = torch.nested.nested_tensor(samples, layout=torch.jagged)
    layout = replay.thd_layout(input_ids, tp_size=2, num_experts=NUM_EXPERTS)
    assert (layout.batch_size, layout.seq_len) == (3, 11)
    padded_ids = torch.zeros(3, 11, dtype=torch.long)
    for row, sample in enumerate(samples):
        padded_ids[row, : len(sample)] = sample
    ids = replay.pack(input_ids.unsqueeze(-1) if False else torch.nested.nested_tensor(
        [s.unsqueeze(-1) for s in samples], layout=torch.jagged), layout, fill=0)
    assert torch.equal(ids, replay.pack(padded_ids.unsqueeze(-1), layout, fill=0))

    total = layout.total_tokens
    model = build_tiny_moe(max_sequence_length=total)
    batch = Batch(ids.view(1, -1), torch.arange(total).view(1, -1),
                  torch.ones(total, total, dtype=torch.bool).triu(1)[None, None], ids.view(1, -1))
    scope = replay.for_model(model)
    recorded, maps = _record_then_shift(model, batch, scope)
    _, stacked = replay.stack_layers(recorded)
    jagged = replay.unpack(stacked, layout, nested=True)  # [batch, j, layers, topk], verl's form
    assert jagged.is_nested and jagged.offsets().diff().tolist() == lengths
    padded = replay.unpack(stacked, layout)
    for row, part in enumerate(jagged.unbind()):
        assert torch.equal(part, padded[row, : lengths[row]])
    repacked = replay.pack(jagged, layout)
    assert torch.equal(repacked, replay.pack(padded, layout))
    scope.set_targets(repacked)
    scope.set_action("replay_forward")
    token = ~layout.padding_mask()
    for got, want in zip(_replayed_maps(model, batch), maps, strict=True):
        assert torch.equal(got[token], want[token])
    with pytest.raises(ValueError, match="lengths"):
        replay.pack(torch.nested.nested_tensor([torch.zeros(2, 2, 2)] * 3, layout=torch.jagged), layout)
