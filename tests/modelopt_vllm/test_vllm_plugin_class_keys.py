"""``modelopt.vllm_plugin_class_keys``: ModelOpt's ``QuantModuleRegistry`` after its vLLM plugin registered
vLLM's layers, ``FusedMoE`` being a factory function from vLLM 0.24.

ModelOpt 0.44-0.45 with vLLM 0.24-0.26: the patch drops the function key (environment
``modelopt-0.45-vllm-0.24``). ModelOpt 0.46+: the plugin registers module classes only, native
(``e2e-vllm-0.29``, ModelOpt 0.47).
"""

from __future__ import annotations

import contextlib
from importlib.metadata import version

import pytest
from packaging.version import Version
from patchkit.patches.modelopt import _vllm_plugin_class_keys
from patchkit.patches.modelopt._checks._vllm_registry import registry_state

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason

PATCH = "modelopt.vllm_plugin_class_keys"
pytestmark = pytest.mark.usefixtures("patches_restored")
NATIVE = Version(version("nvidia-modelopt")) >= Version("0.46")
patched_only = pytest.mark.skipif(NATIVE, reason="ModelOpt 0.46+ registers module classes only (native)")
native_only = pytest.mark.skipif(not NATIVE, reason="ModelOpt 0.44-0.45 register vLLM's FusedMoE function")


@contextlib.contextmanager
def _registry_as_modelopt_left_it():
    """The keys the patch dropped put back while it reports applied (a registration cannot be bypassed by
    patchkit's ``upstream_behaviour``)."""
    _vllm_plugin_class_keys.restore_dropped_keys()
    try:
        yield
    finally:
        _vllm_plugin_class_keys.drop_non_class_keys()


@contextlib.contextmanager
def _vllms_factory_registered():
    """The native test's foil: vLLM's ``FusedMoE`` factory function registered as ModelOpt 0.44-0.45 do."""
    from modelopt.torch.quantization.nn import QuantModuleRegistry
    from vllm.model_executor.layers.fused_moe import layer

    factory = getattr(layer, "FusedMoE", None) or layer.FusedMoEFactory
    assert not isinstance(factory, type), factory
    registry = QuantModuleRegistry
    registry._registry[factory] = object
    registry._key_registry[factory] = "vllm_FusedMoE"
    try:
        yield
    finally:
        registry._registry.pop(factory)
        registry._key_registry.pop(factory)


def test_patched_on_modelopt_0_44_to_0_45_and_native_from_0_46():
    with patchkit.applied(PATCH) as (record,):
        if NATIVE:
            assert record.reason is Reason.NATIVE, record.to_dict()
        else:
            assert record.state.installed and record.variant == "drop-non-class-keys", record.to_dict()


@patched_only
def test_modelopt_alone_raises_type_error_on_lookups_and_quantize(applied):
    """Upstream pinned: the failure the patch exists for, on ModelOpt's own plugin and vLLM's own factory."""
    with _registry_as_modelopt_left_it():
        state = registry_state()
    assert [name.rpartition(".")[2] for name in state["non_class_keys"]] == ["FusedMoE"], state
    assert str(state["unregistered"]).startswith("TypeError: issubclass() arg 2 must be a class"), state
    assert str(state["quantize"]).startswith("TypeError: issubclass() arg 2 must be a class"), state


def test_registry_answers_lookups_and_quantizes(applied):
    state = registry_state()
    assert state["plugin"], state
    assert state["non_class_keys"] == [], state
    assert state["unregistered"] is False, state
    assert state["row_parallel"] is True, state
    assert state["quantize"] == "quantized", state


@patched_only
def test_revert_puts_the_dropped_key_back():
    with patchkit.applied(PATCH):
        assert registry_state()["non_class_keys"] == []
    assert [name.rpartition(".")[2] for name in registry_state()["non_class_keys"]] == ["FusedMoE"]


@native_only
def test_modelopt_registers_no_function_for_vllms_fused_moe_itself(applied):
    """Native from 0.46: no patch installed, and the plugin left no key that is not a class, though vLLM's
    ``FusedMoE`` is a factory function here. Fails when ModelOpt registers it again (the foil below)."""
    assert not applied.state.installed
    state = registry_state()
    assert state["plugin"] and state["non_class_keys"] == [], state
    assert state["quantize"] == "quantized", state


@native_only
def test_vllms_factory_registered_as_0_45_does_breaks_lookups(applied):
    with _vllms_factory_registered():
        state = registry_state()
    assert str(state["unregistered"]).startswith("TypeError: issubclass() arg 2 must be a class"), state


def test_vllm_plugin_class_keys_check_is_verified(applied):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("modelopt.vllm_plugin_class_keys")
def test_vllm_plugin_class_keys_check_fails_with_a_function_key(applied):
    """0.44-0.45: ModelOpt's registry as its plugin left it; 0.46+: vLLM's factory registered as 0.45 does."""
    put_back = _vllms_factory_registered() if NATIVE else _registry_as_modelopt_left_it()
    with put_back:
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "keys of QuantModuleRegistry that are not classes: expected none, found" in verdict.message, \
        verdict.message
