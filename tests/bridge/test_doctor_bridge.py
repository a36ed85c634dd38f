"""`patchkit doctor` on the real Megatron-Bridge: each Bridge self-check verifies its patch on Bridge's own
functions, and fails with Bridge's own behaviour back in place (``upstream_behaviour``) while the status
still says applied; a native claim fails when the upstream feature is taken away."""

from __future__ import annotations

import pytest
from doctor_verdicts import bypassed_verdict, verdict_of

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason

BRIDGE_PATCHES = (
    "bridge.modelopt_layer_spec", "bridge.quant_linear_parallelism", "bridge.skip_quantizer_params",
    "bridge.expert_local_to_global", "bridge.expert_sort_key",
)


pytestmark = pytest.mark.usefixtures("patches_restored")


@pytest.fixture
def applied_bridge():
    with patchkit.applied(*BRIDGE_PATCHES) as statuses:
        yield {s.id: s for s in statuses}


def test_every_bridge_check_is_verified(applied_bridge):
    found = {v.id: v for v in run(BRIDGE_PATCHES, device="cpu")[0]}
    assert {pid: found[pid].verdict for pid in BRIDGE_PATCHES} == dict.fromkeys(BRIDGE_PATCHES, VERIFIED), \
        {pid: found[pid].message for pid in BRIDGE_PATCHES}


def _bypassed(applied, patch_id: str, monkeypatch, take_native_away) -> object:
    """The verdict with upstream's code back (applied patch) or the native feature removed (native patch)."""
    return bypassed_verdict(patch_id, applied[patch_id].reason is Reason.NATIVE,
                            lambda: take_native_away(monkeypatch))


@pytest.mark.breaks("bridge.modelopt_layer_spec")
def test_layer_spec_check_fails_without_the_modelopt_spec(applied_bridge, monkeypatch):
    from megatron.bridge.models import gpt_provider

    if applied_bridge["bridge.modelopt_layer_spec"].reason is Reason.NATIVE:
        # Bridge 0.2 (native) picks ModelOpt's spec inside its own provide(); replacing the class
        # attribute does not reach that path, so this take-away proves nothing there. Known gap.
        pytest.skip("no take-away of Bridge 0.2's native ModelOpt spec selection written yet")

    def take_away(mp):
        mp.setattr(gpt_provider.GPTModelProvider, "transformer_layer_spec", gpt_provider.local_layer_spec)

    verdict = _bypassed(applied_bridge, "bridge.modelopt_layer_spec", monkeypatch, take_away)
    assert verdict.verdict == FAILED
    assert ("builds ModelOpt's layer spec (its input layernorm): expected "
            "megatron.core.post_training.modelopt.layers.Norm, found" in verdict.message
            or "hands GPTModel a layer spec: expected ModelOpt's spec, found" in verdict.message), verdict.message


@pytest.mark.breaks("bridge.quant_linear_parallelism")
def test_parallelism_check_fails_on_bridges_own_detection(applied_bridge, monkeypatch):
    def take_away(mp):
        # 0.4+: resolving ModelOpt's dynamic classes to the class they wrap; 0.5+ also lists ModelOpt's
        # class names (QuantColumnParallelLinear, QuantRowParallelLinear) in the registry: both go.
        from megatron.bridge.models.conversion import param_mapping

        mp.setattr(param_mapping, "is_modelopt_dynamic_module", lambda module: False, raising=False)
        registry = param_mapping.AutoMapping._MODULE_TYPE_REGISTRY
        mp.setattr(param_mapping.AutoMapping, "_MODULE_TYPE_REGISTRY",
                   {kind: {name for name in names if not name.startswith("Quant")}
                    for kind, names in registry.items()})

    patch_id = "bridge.quant_linear_parallelism"
    if applied_bridge[patch_id].reason is Reason.NATIVE:
        verdict = _bypassed(applied_bridge, patch_id, monkeypatch, take_away)
    else:  # a registration (Call) and a Wrap: undo the registration, put upstream's detection back
        from megatron.bridge.models.conversion.param_mapping import AutoMapping
        from patchkit.patches.bridge.qat import _quant_linear_parallelism

        monkeypatch.setattr(AutoMapping, "_detect_parallelism_type",
                            AutoMapping._detect_parallelism_type.__wrapped__)
        _quant_linear_parallelism.uninstall()
        try:
            verdict = verdict_of(patch_id)
        finally:
            _quant_linear_parallelism.install()
    assert verdict.verdict == FAILED
    assert "AutoMapping._detect_parallelism_type of each ModelOpt-quantized linear: expected {" in verdict.message
    assert "Cannot determine parallelism type" in verdict.message, verdict.message


@pytest.mark.breaks("bridge.skip_quantizer_params")
def test_quantizer_state_check_fails_when_bridge_exports_it(applied_bridge, monkeypatch):
    verdict = _bypassed(applied_bridge, "bridge.skip_quantizer_params", monkeypatch, None)
    assert verdict.verdict == FAILED
    assert "the exported names leave ModelOpt quantizer state out: expected no *_quantizer.* names, found 5" \
        in verdict.message, verdict.message


@pytest.mark.breaks("bridge.expert_local_to_global")
def test_expert_names_check_fails_with_bridges_grouped_only_renumbering(applied_bridge, monkeypatch):
    def take_away(mp):  # 0.5+: renumbering local_experts.N
        from megatron.bridge.models.conversion import model_bridge

        original = model_bridge._megatron_local_name_to_global

        def grouped_only(models, config, name, *args, **kwargs):
            return name if ".local_experts." in name else original(models, config, name, *args, **kwargs)

        mp.setattr(model_bridge, "_megatron_local_name_to_global", grouped_only)

    verdict = _bypassed(applied_bridge, "bridge.expert_local_to_global", monkeypatch, take_away)
    assert verdict.verdict == FAILED
    assert "on EP rank 3 of 4 (8 experts): expected {'decoder.layers.0.mlp.experts.local_experts.1.linear_fc1." \
        "weight': 'decoder.layers.0.mlp.experts.local_experts.7.linear_fc1.weight'}, found {" in verdict.message, \
        verdict.message


@pytest.mark.breaks("bridge.expert_sort_key")
def test_sort_key_check_fails_with_bridges_grouped_only_key(applied_bridge, monkeypatch):
    def take_away(mp):  # 0.5+: the key reading local_experts.N
        from megatron.bridge.models.conversion import model_bridge

        mp.setattr(model_bridge, "extract_sort_key", lambda name: ([0, 0], name))

    verdict = _bypassed(applied_bridge, "bridge.expert_sort_key", monkeypatch, take_away)
    assert verdict.verdict == FAILED
    assert "sorted(names, key=model_bridge.extract_sort_key): expected ['embedding.word_embeddings.weight'" \
        in verdict.message, verdict.message
