"""Megatron-Bridge 0.3: a provider restoring ModelOpt state builds ModelOpt-quantizable layers again.

Derived from ``megatron/bridge/models/gpt_provider.py`` (0.3.1). In 0.2.0rc6 ``default_layer_spec``
returned ``quantization_layer_spec(config)`` when ``config.restore_modelopt_state`` was set; 0.3
renamed that builder ``modelopt_transformer_layer_spec`` and dropped the switch, so a provider asked
to restore ModelOpt state silently builds TransformerEngine layers, which ModelOpt before 0.41
cannot quantize and whose state dict does not match a ModelOpt checkpoint. This wrap restores the
0.2 behaviour: while ``provide()`` runs, a provider that still has the default spec
(``default_layer_spec``) and ``restore_modelopt_state=True`` uses ``modelopt_transformer_layer_spec``.
Providers with their own spec (a ``ModuleSpec``, or another builder) are left alone, as in 0.2.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from megatron.bridge.models import gpt_provider

from patchkit.runtime.probing import get_field

#: The spec builder a dataclass-default provider holds; captured before any patching.
DEFAULT_LAYER_SPEC = gpt_provider.default_layer_spec


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
