"""Megatron-Bridge 0.3-0.6: a provider restoring ModelOpt state builds ModelOpt-quantizable layers again.

Derived from ``megatron/bridge/models/gpt_provider.py`` (0.3.1; 0.4.2, 0.5.1, 0.6.2 read the same way:
``provide()`` and ``mtp_block_spec()`` call ``self.transformer_layer_spec`` and never look at
``restore_modelopt_state``, which 0.4+ honour only in the separate ``gpt/gpt_builder.py`` path).
In 0.2.0rc6 ``default_layer_spec`` returned ``quantization_layer_spec(config)`` when
``config.restore_modelopt_state`` was set; 0.3 renamed that builder ``modelopt_transformer_layer_spec`` and
dropped the switch, so a provider asked to restore ModelOpt state silently builds TransformerEngine layers,
which ModelOpt before 0.41 cannot quantize and whose state dict does not match a ModelOpt checkpoint. This
wrap restores the 0.2 behaviour: while ``provide()`` runs, a provider that still has the default spec
(``default_layer_spec``) and ``restore_modelopt_state=True`` uses ``modelopt_transformer_layer_spec``.
Providers with their own spec (a ``ModuleSpec``, or another builder) are left alone, as in 0.2.

Fresh QAT restores no ModelOpt state, so ``restore_modelopt_state`` stays ``False`` and the wrap does
nothing; :func:`use_modelopt_layer_spec` is the switch for that case (what verl's
``patch_provider_for_qat`` does unconditionally): it sets the provider's spec to Bridge's own ModelOpt
builder, on every Bridge release from 0.2, whether or not the patch is applied.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from megatron.bridge.models import gpt_provider

from patchkit.runtime.probing import get_field

#: The spec builder a dataclass-default provider holds; captured before any patching.
DEFAULT_LAYER_SPEC = gpt_provider.default_layer_spec


def modelopt_layer_spec_builder() -> Callable[..., Any]:
    """Bridge's ModelOpt layer-spec builder: ``modelopt_transformer_layer_spec`` (0.3+), else 0.2's
    ``quantization_layer_spec``."""
    for name in ("modelopt_transformer_layer_spec", "quantization_layer_spec"):
        builder = getattr(gpt_provider, name, None)
        if builder is not None:
            return builder  # type: ignore[no-any-return]
    raise AttributeError(
        "megatron.bridge.models.gpt_provider has neither modelopt_transformer_layer_spec (Bridge 0.3-0.6) nor "
        "quantization_layer_spec (0.2); this Bridge release is not one patchkit knows: check `patchkit list`"
    )


def use_modelopt_layer_spec(provider: Any, enabled: bool = True) -> Any:
    """The fresh-QAT switch: make ``provider.provide()`` build ModelOpt's quantizable layer spec.

    ``enabled=True`` sets ``provider.transformer_layer_spec`` to Bridge's ModelOpt spec builder, so the
    decoder and the MTP block (``mtp_block_spec`` reads the same field) are built from it, with
    ``restore_modelopt_state`` left as it is. ``enabled=False`` puts the default spec back if the
    switch had set it; a provider with a spec of its own is refused then rather than overwritten.
    Returns the provider, so it can wrap the construction:
    ``provider = use_modelopt_layer_spec(bridge.to_megatron_provider())``.
    """
    builder = modelopt_layer_spec_builder()
    current = get_field(provider, "transformer_layer_spec")
    if enabled:
        provider.transformer_layer_spec = builder
    elif current is builder:
        provider.transformer_layer_spec = DEFAULT_LAYER_SPEC
    elif current is not DEFAULT_LAYER_SPEC:
        raise ValueError(
            f"use_modelopt_layer_spec(enabled=False): the provider's transformer_layer_spec is {current!r}, "
            f"not ModelOpt's ({builder.__name__}); it was set elsewhere and is left for its owner to change"
        )
    return provider


def wants_modelopt_spec(provider: Any) -> bool:
    return bool(get_field(provider, "restore_modelopt_state", False)) and (
        get_field(provider, "transformer_layer_spec") is DEFAULT_LAYER_SPEC
    )


def wrap_provide(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def provide(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not wants_modelopt_spec(self):
            return original(self, *args, **kwargs)
        # provide() and mtp_block_spec() both read self.transformer_layer_spec: swap it for the call.
        self.transformer_layer_spec = gpt_provider.modelopt_transformer_layer_spec
        try:
            return original(self, *args, **kwargs)
        finally:
            self.transformer_layer_spec = DEFAULT_LAYER_SPEC

    return provide
