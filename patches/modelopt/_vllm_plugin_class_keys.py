"""Removing the keys of ModelOpt's ``QuantModuleRegistry`` that are not classes, and putting them back.

``QuantModuleRegistry`` keeps two dicts keyed by the registered module class, ``_registry`` (the
quantized module class) and ``_key_registry`` (its name). A key that is not a class never matches a
module and breaks every lookup that reaches it, so both entries are removed. They are popped directly
rather than through ``unregister()``, which first asks every generated class whether it derives from
the key: the same ``issubclass`` that raises. Kept here so ``restore_dropped_keys`` (the revert) puts
them back.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from modelopt.torch.quantization.nn import QuantModuleRegistry

logger = logging.getLogger(__name__)

#: What ``drop_non_class_keys`` removed: each key with its ``_registry`` and ``_key_registry`` values.
_dropped: dict[Any, tuple[Any, Any]] = {}


def drop_non_class_keys() -> None:
    """Remove every key of ``QuantModuleRegistry`` that is not a class (vLLM's ``FusedMoE`` function)."""
    registry: Any = QuantModuleRegistry
    for key in [key for key in registry._registry if not inspect.isclass(key)]:
        _dropped[key] = (registry._registry.pop(key), registry._key_registry.pop(key, None))
    if _dropped:
        logger.warning("patchkit: ModelOpt's QuantModuleRegistry held keys that are not module classes; "
                       "dropped (their layers are not fake-quantized): %s",
                       ", ".join(f"{getattr(key, '__module__', '?')}.{getattr(key, '__qualname__', key)}"
                                 for key in _dropped))


def restore_dropped_keys() -> None:
    """Put back what ``drop_non_class_keys`` removed (a revert)."""
    registry: Any = QuantModuleRegistry
    for key, (quantized, name) in list(_dropped.items()):
        registry._registry[key] = quantized
        if name is not None:
            registry._key_registry[key] = name
        del _dropped[key]
