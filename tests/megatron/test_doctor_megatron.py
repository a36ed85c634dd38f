"""`patchkit doctor` on the real megatron-core: each Megatron self-check verifies its patch, and fails
when the patch is bypassed (upstream's code back in place while the status still says applied)."""

from __future__ import annotations

import pytest
from doctor_verdicts import bypassed_verdict, verdict_of

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason

CHECKED = ("megatron.mtp_postprocess", "megatron.mtp_detach_inputs", "megatron.mtp_recompute",
           "megatron.swiglu_singleton_local_shards")


pytestmark = pytest.mark.usefixtures("patches_restored")


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


@pytest.mark.breaks("megatron.mtp_postprocess")
def test_mtp_postprocess_check_fails_with_upstreams_forward(applied_mtp):
    verdict = verdict_of("megatron.mtp_postprocess", as_upstream=True)
    assert verdict.verdict == FAILED
    assert "returns main-head logits [batch, seq, vocab] when MTP is on: expected (2, 16, 128), found (2, 16)" \
        in verdict.message


@pytest.mark.breaks("megatron.mtp_detach_inputs")
def test_mtp_detach_check_fails_with_upstreams_embeddings(applied_mtp):
    verdict = verdict_of("megatron.mtp_detach_inputs", as_upstream=True)
    assert verdict.verdict == FAILED
    assert "the MTP loss leaves the embedding's gradient unchanged" in verdict.message


# 0.18 hands padding_mask to a _checkpointed_forward without the parameter on every recompute, mask or not.
PADDING_MASK_REFUSED = ("a recomputed MTP layer runs forward and backward with packed sequences (packed_seq_params): "
                        "expected gradients for its parameters, found TypeError: ")


@pytest.mark.breaks("megatron.mtp_recompute")
def test_mtp_recompute_check_fails_with_upstreams_checkpointed_forward():
    """0.14-0.18: the patch bypassed. 0.19 (native): 0.18's ``_checkpointed_forward``, without padding_mask."""
    from megatron.core.transformer.multi_token_prediction import MultiTokenPredictionLayer

    with patchkit.applied("megatron.mtp_recompute") as (status,):
        if status.reason is Reason.NATIVE:
            native = MultiTokenPredictionLayer._checkpointed_forward

            def without_padding_mask(self, hidden_states, decoder_input, attention_mask=None, context=None,
                                     context_mask=None, rotary_pos_emb=None, rotary_pos_cos=None, rotary_pos_sin=None,
                                     attention_bias=None, inference_params=None, packed_seq_params=None,
                                     sequence_len_offset=None):
                return native(self, hidden_states, decoder_input, attention_mask, None, context, context_mask,
                              rotary_pos_emb, rotary_pos_cos, rotary_pos_sin, attention_bias, inference_params,
                              packed_seq_params, sequence_len_offset)

            with pytest.MonkeyPatch.context() as monkeypatch:
                monkeypatch.setattr(MultiTokenPredictionLayer, "_checkpointed_forward", without_padding_mask)
                verdict = verdict_of("megatron.mtp_recompute")
            expected = PADDING_MASK_REFUSED
        else:
            verdict = verdict_of("megatron.mtp_recompute", as_upstream=True)
            expected = (PADDING_MASK_REFUSED if status.variant == "accept-padding-mask" else
                        "takes a non-tensor keyword (packed_seq_params): expected a checkpointed forward and "
                        "backward, found TypeError: save_for_backward")
    assert verdict.verdict == FAILED
    assert expected in verdict.message, verdict.message
    assert expected != PADDING_MASK_REFUSED or "unexpected keyword argument 'padding_mask'" in verdict.message


@pytest.mark.breaks("megatron.swiglu_singleton_local_shards")
def test_swiglu_native_check_fails_on_a_core_without_the_parameter(monkeypatch):
    from megatron.core.transformer import mlp

    monkeypatch.setattr(mlp, "apply_swiglu_sharded_factory", lambda original_sh_ten, sharded_offsets: None)
    verdict = verdict_of("megatron.swiglu_singleton_local_shards")
    assert verdict.verdict == FAILED and "takes singleton_local_shards" in verdict.message


# --- router replay ---

REPLAY = ("megatron.router_replay", "megatron.router_replay_validation", "megatron.moe_alltoall_replay_token_count")


@pytest.fixture
def applied_replay():
    with patchkit.applied(*REPLAY) as statuses:
        yield {s.id: s for s in statuses}


def test_every_router_replay_check_is_verified(applied_replay):
    found = verdicts(*REPLAY)
    assert {pid: found[pid].verdict for pid in REPLAY} == dict.fromkeys(REPLAY, VERIFIED), \
        {pid: found[pid].message for pid in REPLAY}


def test_router_replay_check_leaves_other_routers_replay_state_alone(applied_replay):
    from patchkit.patches.megatron.router_replay._owner import replay_class

    registry = replay_class().global_router_replay_instances
    before = list(registry)
    run(["megatron.router_replay"], device="cpu")
    assert registry == before


@pytest.mark.breaks("megatron.router_replay")
def test_router_replay_check_fails_when_replay_computes_its_own_topk(applied_replay, monkeypatch):
    """Native (0.16+): upstream's replay hook removed; backport (0.14/0.15): the patch bypassed."""
    from patchkit.patches.megatron.router_replay._owner import replay_class

    if applied_replay["megatron.router_replay"].reason is Reason.NATIVE:
        original = replay_class().get_replay_topk

        def ignore_replay(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
            """Records as upstream does, but routes every replayed pass by its own top-k."""
            if getattr(self.router_replay_action, "value", None) == "record":
                return original(self, scores, topk, num_groups, group_topk, default_compute_topk)
            return default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)

        monkeypatch.setattr(replay_class(), "get_replay_topk", ignore_replay)
        verdict = verdict_of("megatron.router_replay")
        expected = "REPLAY_FORWARD of the packed record routes every token as recorded (tokens routed differently): "
    else:  # upstream's TopKRouter: no replay state at all
        verdict = verdict_of("megatron.router_replay", as_upstream=True)
        expected = "has replay state: expected 2 routers with replay state, found 0"
    assert verdict.verdict == FAILED
    assert expected in verdict.message, verdict.message


@pytest.mark.breaks("megatron.router_replay_validation")
def test_router_replay_validation_check_fails_with_upstreams_unchecked_gather(applied_replay):
    verdict = verdict_of("megatron.router_replay_validation", as_upstream=True)
    assert verdict.verdict == FAILED
    assert "wrong token count raises: expected ReplayIndexMismatchError, found " in verdict.message, verdict.message


@pytest.mark.breaks("megatron.moe_alltoall_replay_token_count")
def test_alltoall_token_count_check_fails_with_upstreams_static_count(applied_replay):
    verdict = verdict_of("megatron.moe_alltoall_replay_token_count", as_upstream=True)
    assert verdict.verdict == FAILED
    # 0.19.2's argsort permute fails outright; 0.14-0.16's masked_select permute keeps the wrong count.
    assert ("found RuntimeError" in verdict.message
            or "num_out_tokens under a replay that repeats an expert" in verdict.message and "[64, 64]"
            in verdict.message), verdict.message


@pytest.mark.breaks("megatron.moe_alltoall_replay_token_count")
def test_alltoall_token_count_check_fails_for_a_framework_replay_class_without_the_router_mark(applied_replay):
    from patchkit.runtime.process_engine import engine

    (mark,) = [a for a in engine().installed_actions("megatron.moe_alltoall_replay_token_count")
               if a.name == "forward"]
    mark.restore()
    try:
        (verdict,) = run(["megatron.moe_alltoall_replay_token_count"], device="cpu")[0]
    finally:
        setattr(mark.owner, mark.name, mark.installed)
    assert verdict.verdict == FAILED
    assert "a framework's own replay class" in verdict.message, verdict.message


# --- MTP routers ---

ROUTER_SLOTS = "megatron.mtp_router_slots"


@pytest.fixture
def applied_router_slots():
    with patchkit.applied(*REPLAY, ROUTER_SLOTS) as statuses:
        yield {s.id: s for s in statuses}


def test_mtp_router_slots_check_is_verified(applied_router_slots):
    verdict = verdict_of(ROUTER_SLOTS)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.mtp_router_slots")
def test_mtp_router_slots_check_fails_with_upstreams_numbering(applied_router_slots, monkeypatch):
    """Patched releases: the patch bypassed. Native (0.17-0.18): forced entries sized as 0.16 sizes them."""
    from megatron.core.transformer.moe import moe_utils

    original = moe_utils.track_moe_metrics

    def decoder_only(*args, mtp_num_layers=None, **kwargs):
        return original(*args, mtp_num_layers=None, **kwargs)

    verdict = bypassed_verdict(ROUTER_SLOTS, applied_router_slots[ROUTER_SLOTS].reason is Reason.NATIVE,
                               lambda: monkeypatch.setattr(moe_utils, "track_moe_metrics", decoder_only))
    assert verdict.verdict == FAILED
    # 0.14-0.15: MTP slots empty; 0.16: forced entries sized 2; 0.19: replay numbers [1, 2].
    assert ("empty slots: expected [], found [3, 4]" in verdict.message
            or "sizes entries for the decoder and the MTP layers: expected 4, found" in verdict.message
            or "numbered after the decoder's layers: expected [3, 4], found [1, 2]" in verdict.message), verdict.message
