"""Self-check of ``bridge.modelopt_layer_spec``: A provider with ``restore_modelopt_state=True`` builds
ModelOpt's quantizable layer spec.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from patchkit.selfcheck import CheckContext, SelfCheckFailed, expect

_NVTE = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@contextlib.contextmanager
def _attention_environment() -> Iterator[None]:
    """``TransformerConfig.__post_init__`` writes NVTE_*_ATTN for its attention backend and asserts them
    when the next config is finalized: start without them and put back what was there."""
    saved = {name: os.environ.pop(name, None) for name in _NVTE}
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def tiny_provider(**overrides: Any) -> Any:
    """A ``GPTModelProvider`` for a 2-layer hidden-64 GPT on local attention, restoring ModelOpt state."""
    from megatron.bridge.models import gpt_provider
    from megatron.core.transformer.enums import AttnBackend

    kwargs: dict[str, Any] = dict(
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


def provided_layer_norm(provider: Any) -> Any:
    """The input-layernorm class of the layer spec ``provide()`` hands ``GPTModel``; the error if it fails first.

    ``GPTModel`` is spied on (``mock`` wrapping the real class). ModelOpt's spec uses TransformerEngine's
    norm, which cannot be built without TE, so building may stop after the spec was handed over.
    """
    from megatron.bridge.models import gpt_provider

    spy = mock.MagicMock(wraps=gpt_provider.MCoreGPTModel)
    with mock.patch.object(gpt_provider, "MCoreGPTModel", spy):
        try:
            provider.provide()
        except Exception as exc:  # noqa: BLE001 - what matters is whether the spec reached GPTModel
            if not spy.called:
                return exc
    spec = spy.call_args.kwargs["transformer_layer_spec"]
    layer = spec.layer_specs[0] if hasattr(spec, "layer_specs") else spec  # a block spec on some releases
    norm = layer.submodules.input_layernorm
    return getattr(norm, "module", norm)  # a ModuleSpec or the class itself


def check_modelopt_layer_spec(context: CheckContext) -> None:
    """A provider with ``restore_modelopt_state=True`` builds ModelOpt's quantizable layer spec."""
    from megatron.core.post_training.modelopt.layers import Norm as ModelOptNorm
    from patchkit.patches.megatron._checks._harness import megatron_on

    with megatron_on(context.device), _attention_environment():
        found = provided_layer_norm(tiny_provider())
    if isinstance(found, BaseException):
        raise SelfCheckFailed("GPTModelProvider(restore_modelopt_state=True).provide() hands GPTModel a layer spec",
                              "ModelOpt's spec", f"{type(found).__name__} before GPTModel: "
                              f"{str(found).splitlines()[0][:160] if str(found) else ''}") from found
    expect(found is ModelOptNorm, "GPTModelProvider(restore_modelopt_state=True) builds ModelOpt's layer spec "
           "(its input layernorm)", f"{ModelOptNorm.__module__}.Norm", f"{found.__module__}.{found.__qualname__}")
