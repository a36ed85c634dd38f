"""``bridge.modelopt_layer_spec``: a provider restoring ModelOpt state gets ModelOpt's layer spec.

The spec is observed where the provider hands it to megatron-core: ``GPTModel`` is wrapped by a
``mock`` spy that records its arguments and calls the real class. ModelOpt's spec uses
TransformerEngine's norm (``post_training.modelopt.layers.Norm``), which cannot be built without TE,
so building may stop there; the spec it was given is what this test checks.
"""

from __future__ import annotations

import importlib.metadata
import os
import traceback
from unittest import mock

import pytest
from megatron.bridge.models import gpt_provider
from megatron.core.post_training.modelopt.layers import Norm as ModelOptNorm
from packaging.version import Version
from patchkit.patches.bridge.qat._checks.modelopt_layer_spec import tiny_provider

import patchkit

BRIDGE = Version(importlib.metadata.version("megatron-bridge"))
_NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@pytest.fixture(autouse=True)
def _attention_backend_environment():
    """TransformerConfig.__post_init__ writes NVTE_*_ATTN for its attention backend and asserts them
    when the next config is finalized; start each test without them and put back what was there."""
    saved = {name: os.environ.pop(name, None) for name in _NVTE}
    yield
    for name, value in saved.items():
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value


def _layer_norm_class(provider):
    """The input-layernorm class in the layer spec the provider gives ``GPTModel``, or ``None``.

    ``None``: ``provide()`` failed before reaching ``GPTModel`` (megatron-core 0.16 refuses to build its
    TransformerEngine spec without TE; 0.17+ build it and fail later, or not at all).
    """
    spy = mock.MagicMock(wraps=gpt_provider.MCoreGPTModel)
    with mock.patch.object(gpt_provider, "MCoreGPTModel", spy):
        try:
            provider.provide()
        except (ImportError, NameError, AssertionError, AttributeError, TypeError) as error:
            if not spy.called:  # building the TransformerEngine spec failed without TE
                frames = [frame.name for frame in traceback.extract_tb(error.__traceback__)]
                in_te_spec = any("transformer_engine" in name for name in frames)  # 0.19: TESpecProvider is None
                assert in_te_spec or "TE" in str(error) or "ransformer" in str(error), (error, frames)
                return None
    spec = spy.call_args.kwargs["transformer_layer_spec"]
    layer = spec.layer_specs[0] if hasattr(spec, "layer_specs") else spec  # a block spec on some releases
    norm = layer.submodules.input_layernorm
    return getattr(norm, "module", norm)  # a ModuleSpec or the class itself


def _fails_building_the_transformer_engine_spec(provider) -> bool:
    """The provider did not build ModelOpt's spec: it failed on the TE spec, or built another one."""
    return _layer_norm_class(provider) is not ModelOptNorm


def test_provider_restoring_modelopt_state_builds_the_modelopt_spec(megatron_cpu):
    provider = tiny_provider()
    with patchkit.applied("bridge.modelopt_layer_spec") as records:
        expected = "native" if BRIDGE < Version("0.3.0rc0") else "applied"
        assert [(r.reason or r.state).value for r in records] == [expected]
        norm = _layer_norm_class(provider)
    assert norm is ModelOptNorm
    assert provider.transformer_layer_spec is gpt_provider.default_layer_spec


@pytest.mark.skipif(BRIDGE < Version("0.3.0rc0"), reason="0.2 builds the ModelOpt spec natively")
def test_without_the_patch_bridge_03_builds_another_spec(megatron_cpu):
    assert _fails_building_the_transformer_engine_spec(tiny_provider())


def test_provider_without_restore_or_with_its_own_spec_is_left_alone(megatron_cpu):
    with patchkit.applied("bridge.modelopt_layer_spec"):
        assert _fails_building_the_transformer_engine_spec(tiny_provider(restore_modelopt_state=False))
        own = _layer_norm_class(tiny_provider(transformer_layer_spec=gpt_provider.local_layer_spec))
    assert own is not ModelOptNorm


@pytest.mark.parametrize("with_patch", [False, True])
def test_fresh_qat_switch_gives_the_modelopt_spec_without_restoring_state(megatron_cpu, with_patch):
    """``use_modelopt_layer_spec``: the same call on every Bridge release, patch applied or not."""
    from patchkit.patches.bridge.qat import use_modelopt_layer_spec

    provider = tiny_provider(restore_modelopt_state=False)
    assert use_modelopt_layer_spec(provider) is provider
    if with_patch:
        with patchkit.applied("bridge.modelopt_layer_spec"):
            norm = _layer_norm_class(provider)
    else:
        norm = _layer_norm_class(provider)
    assert norm is ModelOptNorm
    assert provider.restore_modelopt_state is False
    use_modelopt_layer_spec(provider, enabled=False)
    assert provider.transformer_layer_spec is gpt_provider.default_layer_spec
    assert _fails_building_the_transformer_engine_spec(provider)


def test_fresh_qat_switch_off_leaves_a_spec_set_elsewhere_alone(megatron_cpu):
    from patchkit.patches.bridge.qat import use_modelopt_layer_spec

    provider = tiny_provider(transformer_layer_spec=gpt_provider.local_layer_spec)
    with pytest.raises(ValueError, match="set elsewhere"):
        use_modelopt_layer_spec(provider, enabled=False)
    assert provider.transformer_layer_spec is gpt_provider.local_layer_spec
    use_modelopt_layer_spec(tiny_provider(), enabled=False)  # default spec: nothing to undo, no error
