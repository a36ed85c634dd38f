"""``megatron.mla_v_padding``: MLA on packed (THD) sequences hands its core attention V padded to the q/k head size.

Upstream's own ``MLASelfAttention`` (local spec: linear layers, RoPE and the layer's forward are
megatron-core's); only its core attention stands in for TransformerEngine's
(``patches/megatron/attention/_checks/_mla_core_attention.py``): it records the head sizes it gets,
refuses THD input whose q/k and V head sizes differ as TE does where no kernel serves them, and
computes attention in torch. The q/k head size is 16, V's 8. The unpadded reference is the same
layer run on each sequence alone, unpacked, where no release pads V; on 0.14-0.17 also the packed
forward with the stand-in told to take V of 8 as it comes. ``fixtures/mla_v_padding_upstream.json``
holds megatron-core 0.18.2's own output for the same weights and input.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch
from doctor_verdicts import verdict_of
from make_mla_v_padding_fixture import load_fixture
from packaging.version import Version
from patchkit.patches.megatron._checks._harness import megatron_on
from patchkit.patches.megatron.attention import _mla_v_padding
from patchkit.patches.megatron.attention._checks._mla_core_attention import (
    QK_HEAD_DIM,
    QK_POS_EMB_HEAD_DIM,
    V_HEAD_DIM,
    UnequalHeadSizesError,
    build_mla,
    packed_forward,
    packed_hidden_states,
    sequence_by_sequence,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED

PATCH = "megatron.mla_v_padding"
QK_SIZE = QK_HEAD_DIM + QK_POS_EMB_HEAD_DIM
NATIVE = Version(version("megatron-core")) >= Version("0.18")
TOLERANCE = 1e-5

pytestmark = pytest.mark.usefixtures("patches_restored")
before_0_18 = pytest.mark.skipif(NATIVE, reason="megatron-core 0.18+ pads V itself")
from_0_18 = pytest.mark.skipif(not NATIVE, reason="megatron-core before 0.18 does not pad V")


def _largest_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@before_0_18
def test_upstream_before_0_18_hands_core_attention_v_of_its_own_head_size():
    """The gap: 0.14-0.17 give TE's core attention V of 8 next to q/k of 16 for THD input."""
    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        with pytest.raises(UnequalHeadSizesError, match="head_dim_qk=16 != head_dim_v=8"):
            packed_forward(layer, packed_hidden_states("cpu"))
    call = layer.core_attention.calls[-1]
    assert (call.qkv_format, call.query_head_dim, call.value_head_dim) == ("thd", QK_SIZE, V_HEAD_DIM)


@from_0_18
def test_upstream_from_0_18_pads_v_natively():
    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        hidden_states = packed_hidden_states("cpu")
        packed = packed_forward(layer, hidden_states)
        thd_call = layer.core_attention.calls[-1]
        reference = sequence_by_sequence(layer, hidden_states)
    assert (thd_call.value_head_dim, thd_call.declared_v_head_dim) == (QK_SIZE, QK_SIZE)
    assert layer.core_attention.hidden_size_per_attention_head_v == V_HEAD_DIM
    assert _largest_difference(packed, reference) <= TOLERANCE


def test_core_attention_gets_v_padded_to_the_qk_head_size_and_the_output_is_the_unpadded_one():
    """On 0.14-0.17 with the patch, on 0.18+ natively. The layer is built before the patch installs."""
    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        hidden_states = packed_hidden_states("cpu")
        reference = sequence_by_sequence(layer, hidden_states)
        unpadded = None if NATIVE else packed_forward(layer, hidden_states, unequal_thd_heads_allowed=True)
        with patchkit.applied(PATCH) as (status,):
            assert status.to_dict()["state"] == ("skipped" if NATIVE else "applied")
            packed = packed_forward(layer, hidden_states)
        thd_call = layer.core_attention.calls[-1]
    assert (thd_call.qkv_format, thd_call.query_head_dim, thd_call.key_head_dim) == ("thd", QK_SIZE, QK_SIZE)
    assert (thd_call.value_head_dim, thd_call.declared_v_head_dim) == (QK_SIZE, QK_SIZE)
    assert layer.core_attention.hidden_size_per_attention_head_v == V_HEAD_DIM  # put back after the call
    assert packed.shape == reference.shape == hidden_states.shape
    assert _largest_difference(packed, reference) <= TOLERANCE
    if unpadded is not None:
        assert _largest_difference(packed, unpadded) <= TOLERANCE


def test_output_equals_megatron_core_0_18s_own_for_the_same_weights_and_input():
    made_with, weights, lengths, hidden_states, upstream_output = load_fixture()
    assert made_with["megatron_core"].startswith("0.18")
    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        missing, unexpected = layer.load_state_dict(weights, strict=False)
        assert not unexpected and not [name for name in missing if not name.endswith("_extra_state")]
        with patchkit.applied(PATCH):
            output = packed_forward(layer, hidden_states, lengths)
    assert _largest_difference(output, upstream_output) <= TOLERANCE


def test_checkpointed_core_attention_pads_v_in_forward_and_in_its_recomputation():
    """Selective recompute of core attention: backward runs core attention again, and V is padded there too.

    The gradients equal those of each sequence run alone, unpacked (where V is never padded).
    """
    with megatron_on("cpu"):
        layer = build_mla(recompute_granularity="selective", recompute_modules=["core_attn"])
        layer.train()
        assert layer.checkpoint_core_attention
        hidden_states = packed_hidden_states("cpu")
        weight = torch.randn(hidden_states.shape, generator=torch.Generator().manual_seed(5))

        def gradients(run):
            layer.zero_grad()
            (run() * weight).sum().backward()
            return {name: p.grad.clone() for name, p in layer.named_parameters()}

        reference = gradients(lambda: sequence_by_sequence(layer, hidden_states))
        calls_before = len(layer.core_attention.calls)
        with patchkit.applied(PATCH):
            padded = gradients(lambda: packed_forward(layer, hidden_states))
        thd_calls = layer.core_attention.calls[calls_before:]
    seen = [(c.qkv_format, c.value_head_dim, c.declared_v_head_dim) for c in thd_calls]
    assert seen == [("thd", QK_SIZE, QK_SIZE)] * 2  # the forward and its recomputation in backward
    assert reference.keys() == padded.keys()
    for name in reference:
        assert _largest_difference(padded[name], reference[name]) <= TOLERANCE, name


def test_unpacked_input_and_equal_head_sizes_are_left_alone():
    with megatron_on("cpu"), torch.no_grad(), patchkit.applied(PATCH):
        layer = build_mla()
        sequence_by_sequence(layer, packed_hidden_states("cpu"))
        assert {(c.qkv_format, c.value_head_dim) for c in layer.core_attention.calls} == {("sbhd", V_HEAD_DIM)}
        equal = build_mla(v_head_dim=QK_SIZE)
        packed_forward(equal, packed_hidden_states("cpu"))
        assert [(c.qkv_format, c.value_head_dim, c.declared_v_head_dim) for c in equal.core_attention.calls] == [
            ("thd", QK_SIZE, QK_SIZE)]


@before_0_18
def test_reverting_takes_the_padding_off_layers_that_ran():
    with megatron_on("cpu"), torch.no_grad():
        layer = build_mla()
        hidden_states = packed_hidden_states("cpu")
        with patchkit.applied(PATCH):
            packed_forward(layer, hidden_states)
        assert not layer.core_attention._forward_pre_hooks and not layer.core_attention._forward_hooks
        with pytest.raises(UnequalHeadSizesError):
            packed_forward(layer, hidden_states)


@before_0_18
def test_declared_v_head_size_is_put_back_when_core_attention_raises():
    with megatron_on("cpu"), torch.no_grad(), patchkit.applied(PATCH):
        layer = build_mla()
        layer.core_attention.forward = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("kernel failed"))
        with pytest.raises(RuntimeError, match="kernel failed"):
            packed_forward(layer, packed_hidden_states("cpu"))
        assert layer.core_attention.hidden_size_per_attention_head_v == V_HEAD_DIM


def test_v_wider_than_qk_is_not_cut_and_other_inputs_pass_through():
    """0.18 pads by a negative width there (V cut to the q/k size); the patch leaves such V as it comes."""
    from megatron.core.packed_seq_params import PackedSeqParams

    thd = PackedSeqParams(qkv_format="thd")
    query, narrow, wide = torch.zeros(3, 2, 16), torch.zeros(3, 2, 8), torch.zeros(3, 2, 24)
    assert _mla_v_padding.needs_padding(None, query, narrow, thd)
    assert not _mla_v_padding.needs_padding(None, query, wide, thd)
    assert not _mla_v_padding.needs_padding(None, query, narrow, PackedSeqParams(qkv_format="sbhd"))
    assert not _mla_v_padding.needs_padding(None, query, narrow, None)
    assert not _mla_v_padding.needs_padding(None, query, None, thd)  # MLA's absorbed decode has no V


def test_dsa_core_attention_is_left_alone_as_0_18_does():
    from megatron.core.packed_seq_params import PackedSeqParams

    class Config:
        experimental_attention_variant = "dsa"

    assert not _mla_v_padding.needs_padding(Config(), torch.zeros(3, 2, 16), torch.zeros(3, 2, 8),
                                            PackedSeqParams(qkv_format="thd"))


def test_output_of_three_dimensions_is_cut_back_too():
    padded = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    assert torch.equal(_mla_v_padding.trim_output(padded, 2, 4), padded[..., :2])
    assert torch.equal(_mla_v_padding.trim_output(padded.reshape(2, 12), 2, 4), padded[..., :2])


def test_check_is_verified():
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.mla_v_padding")
def test_check_fails_when_v_reaches_core_attention_unpadded(monkeypatch):
    # Not bypassable by upstream_behaviour (the padding sits on each layer's core attention, taken off
    # by a registration): on 0.14-0.17 the installed patch is told nothing needs padding, on 0.18+
    # upstream's own padding step is made to pad nothing.
    if NATIVE:
        from megatron.core.transformer import multi_latent_attention

        monkeypatch.setattr(multi_latent_attention, "_prepare_mla_core_attention_value",
                            lambda attention, query, value, params: (value, False, value.shape[-1], value.shape[-1]))
    else:
        monkeypatch.setattr(_mla_v_padding, "needs_padding", lambda *args: False)
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == FAILED
    assert "MLA's packed (THD) forward runs on core attention that needs equal head sizes" in verdict.message
    assert "UnequalHeadSizesError" in verdict.message
