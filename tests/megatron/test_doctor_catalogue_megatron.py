"""`patchkit doctor` for the Megatron-Core catalogue patches added from the RL frameworks' inventory:
each self-check is verified on the installed release, and fails when the patch is
bypassed (upstream's code back while the status says applied) or, for a native claim, when
upstream's behaviour is taken away."""

from __future__ import annotations

import pytest
from doctor_verdicts import bypassed_verdict, verdict_of

import patchkit
from patchkit.doctor import FAILED, VERIFIED

pytestmark = pytest.mark.usefixtures("patches_restored")


# --- megatron.tms_hook_mode ---

FORCING_STATEMENT = '''
try:
    from torch_memory_saver import torch_memory_saver

    torch_memory_saver.hook_mode = "torch"
    HAVE_TORCH_MEMORY_SAVER = True
except ImportError:
    HAVE_TORCH_MEMORY_SAVER = False
'''


def test_tms_hook_mode_check_is_verified():
    pytest.importorskip("torch_memory_saver")
    verdict = verdict_of("megatron.tms_hook_mode", applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.tms_hook_mode")
def test_tms_hook_mode_check_fails_with_upstreams_setter(monkeypatch):
    """0.16+: torch_memory_saver's own setter back. 0.14/0.15 (native): the release given 0.16's statement."""
    pytest.importorskip("torch_memory_saver")
    from patchkit.patches.megatron.memory._checks import _tms_hook_mode_probe as probe

    def source_with_the_forcing_statement(name):
        return ("<0.16 dynamic_context>", FORCING_STATEMENT) if name.endswith("dynamic_context") else None

    with patchkit.applied("megatron.tms_hook_mode") as (status,):
        verdict = bypassed_verdict(
            "megatron.tms_hook_mode", status.to_dict()["reason"] == "native",
            lambda: monkeypatch.setattr(probe, "installed_source", source_with_the_forcing_statement))
    assert verdict.verdict == FAILED
    assert "keeps a hook mode set before it: expected preload, found torch" in verdict.message


# --- patches whose check is verified when applied, and fails with upstream's code back ---


@pytest.mark.parametrize("patch_id", ["megatron.routing_replay_keyword", "megatron.output_processor",
                                      "megatron.moe_recompute_release"])
def test_the_check_of_the_applied_patch_is_verified(patch_id):
    verdict = verdict_of(patch_id, applied=True)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.parametrize("patch_id, expected", [
    pytest.param("megatron.routing_replay_keyword",
                 "TransformerConfig accepts enable_routing_replay=True: expected a config, found TypeError",
                 marks=pytest.mark.breaks("megatron.routing_replay_keyword"), id="upstreams-config-init"),
    pytest.param("megatron.moe_recompute_release",
                 "no tensor with autograd history is reachable from the model (holders): expected [], found "
                 "['decoder.layers.0.mlp.token_dispatcher.probs', 'decoder.layers.1.mlp.token_dispatcher.probs']",
                 marks=pytest.mark.breaks("megatron.moe_recompute_release"), id="upstreams-dispatchers"),
])
def test_the_check_fails_with_upstreams_code_back(patch_id, expected):
    verdict = verdict_of(patch_id, applied=True, as_upstream=True)
    assert verdict.verdict == FAILED
    assert expected in verdict.message, verdict.message


# --- megatron.output_processor ---


@pytest.mark.breaks("megatron.output_processor")
def test_output_processor_check_fails_without_the_hook(monkeypatch):
    """0.14-0.17: upstream's forward back (TypeError). 0.18+ (native): a forward that ignores the hook."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    with patchkit.applied("megatron.output_processor") as (status,):
        if status.to_dict()["reason"] == "native":
            native = GPTModel.forward

            def forward_ignoring_the_hook(self, *args, output_processor=None, output_processor_context=None, **kw):
                return native(self, *args, **kw)

            monkeypatch.setattr(GPTModel, "forward", forward_ignoring_the_hook)
            verdict = verdict_of("megatron.output_processor")
            expected = "with an output_processor the output layer never runs (no full logits): expected 0, found 1"
        else:
            verdict = verdict_of("megatron.output_processor", as_upstream=True)
            expected = "GPTModel.forward takes output_processor and output_processor_context: expected the " \
                       "processor's result, found TypeError"
    assert verdict.verdict == FAILED
    assert expected in verdict.message


def test_output_processor_check_fails_when_mtp_output_reaches_the_processor(monkeypatch):
    """0.14-0.17: a processor branch that leaves the MTP chunks on the hidden states fails the MTP step."""
    from patchkit.patches.megatron.gpt import _output_processor

    with patchkit.applied("megatron.output_processor") as (status,):
        if status.to_dict()["reason"] == "native":
            pytest.skip("0.18+: upstream's own branch, nothing of patchkit's to break")
        monkeypatch.setattr(_output_processor, "holds_mtp_output", lambda model: False)
        verdict = verdict_of("megatron.output_processor")
    assert verdict.verdict == FAILED
    assert "with MTP the processor receives the main chunk [seq, batch, hidden]: expected (16, 2, 64), " \
           "found (32, 2, 64)" in verdict.message, verdict.message


def test_output_processor_check_is_verified_beside_the_mtp_postprocess_patch():
    """With ``megatron.mtp_postprocess`` on (it makes a forward with labels return logits), the check
    still compares the processor's log-probs with upstream's per-token loss, not with those logits."""
    with patchkit.applied("megatron.output_processor", "megatron.mtp_postprocess"):
        verdict = verdict_of("megatron.output_processor")
    assert verdict.verdict == VERIFIED, verdict.message


# --- megatron.tp_group_if_none_helper (native) ---


def test_tp_group_if_none_helper_is_native_and_its_check_is_verified():
    with patchkit.applied("megatron.tp_group_if_none_helper") as (status,):
        assert (status.to_dict()["state"], status.to_dict()["reason"]) == ("skipped", "native")
        verdict = verdict_of("megatron.tp_group_if_none_helper")
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.tp_group_if_none_helper")
def test_tp_group_if_none_helper_check_fails_without_upstreams_helper(monkeypatch):
    """megatron-core 0.12's state: no such helper in megatron.core.utils."""
    from megatron.core import utils

    monkeypatch.delattr(utils, "get_tensor_model_parallel_group_if_none")
    verdict = verdict_of("megatron.tp_group_if_none_helper")
    assert verdict.verdict == FAILED
    assert "megatron.core.utils has get_tensor_model_parallel_group_if_none: expected a function, found NoneType" \
        in verdict.message


def test_tp_group_if_none_helper_check_fails_when_the_helper_ignores_none(monkeypatch):
    from megatron.core import utils

    monkeypatch.setattr(utils, "get_tensor_model_parallel_group_if_none", lambda group, **_: group)
    verdict = verdict_of("megatron.tp_group_if_none_helper")
    assert verdict.verdict == FAILED
    assert "for None it gives the tensor-parallel group" in verdict.message
