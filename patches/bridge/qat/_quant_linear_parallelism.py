"""Teach ``AutoMapping`` the tensor parallelism of ModelOpt's quantized Megatron linears (Bridge 0.2-0.3).

Derived from ``megatron/bridge/models/conversion/param_mapping.py::AutoMapping`` (0.2.0rc6, 0.3.1):
``_detect_parallelism_type`` looks the module's class *name* up in ``_MODULE_TYPE_REGISTRY``.
``mtq.quantize`` swaps each module's class for a dynamic subclass named with ModelOpt's prefix
(``ColumnParallelLinear`` becomes ``QuantColumnParallelLinear``), which the registry does not know,
so conversion of a quantized model fails with "Cannot determine parallelism type". A quantized
module splits its weight exactly like the module it wraps; the names are registered through
upstream's public ``AutoMapping.register_module_type`` with the parallelism of the original.

``TELayerNormColumnParallelLinear`` is special-cased upstream by exact name (its ``layer_norm_*``
parameters are replicated); its quantized twin is routed through the same rule by
:func:`wrap_detect_parallelism_type`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from megatron.bridge.models.conversion.param_mapping import AutoMapping

#: ModelOpt's dynamic-class prefix (``QuantModuleRegistry.prefix``), fixed across 0.37-0.47.
QUANT_PREFIX = "Quant"
_FUSED_NORM_LINEAR = "TELayerNormColumnParallelLinear"
#: What :func:`install` added, so that :func:`uninstall` removes exactly that.
_added: list[tuple[str, str]] = []


def quantized_names() -> list[tuple[str, str]]:
    """``(Quant<name>, parallelism)`` for every column/row module the registry knows now."""
    registry = AutoMapping._MODULE_TYPE_REGISTRY
    return [
        (QUANT_PREFIX + name, parallelism)
        for parallelism in ("column", "row")
        for name in sorted(registry[parallelism])
        if not name.startswith(QUANT_PREFIX)
    ]


def install() -> None:
    registry = AutoMapping._MODULE_TYPE_REGISTRY
    for name, parallelism in quantized_names():
        if name not in registry[parallelism]:
            AutoMapping.register_module_type(name, parallelism)
            _added.append((name, parallelism))


def uninstall() -> None:
    registry = AutoMapping._MODULE_TYPE_REGISTRY
    while _added:
        name, parallelism = _added.pop()
        registry[parallelism].discard(name)


def wrap_detect_parallelism_type(original: Callable[[Any, Any], str]) -> Callable[[Any, Any], str]:
    """Apply upstream's fused-layernorm rule to ``QuantTELayerNormColumnParallelLinear`` too."""

    @functools.wraps(original)
    def _detect_parallelism_type(self: Any, module: Any) -> str:
        if type(module).__name__ == QUANT_PREFIX + _FUSED_NORM_LINEAR:
            param = self.megatron_param or ""
            return "replicated" if param.endswith(("layer_norm_weight", "layer_norm_bias")) else "column"
        return original(self, module)

    return _detect_parallelism_type
