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
import torch
from megatron.bridge.models import gpt_provider
from megatron.core.post_training.modelopt.layers import Norm as ModelOptNorm
from packaging.version import Version

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


def _provider(**overrides):
    from megatron.core.transformer.enums import AttnBackend

    kwargs = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, vocab_size=128, seq_length=16,
        use_cpu_initialization=True, restore_modelopt_state=True, attention_backend=AttnBackend.local,
        gradient_accumulation_fusion=False, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, apply_rope_fusion=False,
        params_dtype=torch.float32, bf16=False,
    )
    kwargs.update(overrides)
    provider = gpt_provider.GPTModelProvider(**kwargs)
    if hasattr(provider, "finalize"):
        provider.finalize()
    if hasattr(provider, "_pg_collection"):
        from megatron.core.process_groups_config import ProcessGroupCollection

        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    return provider


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
    provider = _provider()
    with patchkit.applied("bridge.modelopt_layer_spec") as records:
        expected = "native" if BRIDGE < Version("0.3.0rc0") else "applied"
        assert [(r.reason or r.state).value for r in records] == [expected]
        norm = _layer_norm_class(provider)
    assert norm is ModelOptNorm
    assert provider.transformer_layer_spec is gpt_provider.default_layer_spec


@pytest.mark.skipif(BRIDGE < Version("0.3.0rc0"), reason="0.2 builds the ModelOpt spec natively")
def test_without_the_patch_bridge_03_builds_another_spec(megatron_cpu):
    assert _fails_building_the_transformer_engine_spec(_provider())


def test_provider_without_restore_or_with_its_own_spec_is_left_alone(megatron_cpu):
    with patchkit.applied("bridge.modelopt_layer_spec"):
        assert _fails_building_the_transformer_engine_spec(_provider(restore_modelopt_state=False))
        own = _layer_norm_class(_provider(transformer_layer_spec=gpt_provider.local_layer_spec))
    assert own is not ModelOptNorm


@pytest.mark.parametrize("with_patch", [False, True])
def test_fresh_qat_switch_gives_the_modelopt_spec_without_restoring_state(megatron_cpu, with_patch):
    """``use_modelopt_layer_spec``: the same call on every Bridge release, patch applied or not."""
    from patchkit.patches.bridge.qat_export import use_modelopt_layer_spec

    provider = _provider(restore_modelopt_state=False)
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
    from patchkit.patches.bridge.qat_export import use_modelopt_layer_spec

    provider = _provider(transformer_layer_spec=gpt_provider.local_layer_spec)
    with pytest.raises(ValueError, match="set elsewhere"):
        use_modelopt_layer_spec(provider, enabled=False)
    assert provider.transformer_layer_spec is gpt_provider.local_layer_spec
    use_modelopt_layer_spec(_provider(), enabled=False)  # default spec: nothing to undo, no error
