"""Safe probes of foreign objects: configs from other stacks, callables from other releases.

Patches never read a config field with bare attribute access: a ``TransformerConfig`` from another
release, or a config object from another framework, may not have the field at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

_MISSING = object()


def get_field(obj: Any, path: str, default: Any = None) -> Any:
    """Return ``obj.<path>`` for a dotted ``path``, or ``default`` if any step is missing or None.

    Each step reads a mapping key or an attribute, so dicts, dataclasses and namespaces all work.
    Properties that raise are treated as missing rather than propagated.
    """
    current = obj
    for name in path.split("."):
        if current is None:
            return default
        if isinstance(current, Mapping):
            current = current.get(name, _MISSING)
        else:
            try:
                current = getattr(current, name, _MISSING)
            except Exception:  # a property of a foreign object that fails to compute
                return default
        if current is _MISSING:
            return default
    return default if current is None else current


def first_field(obj: Any, paths: Iterable[str], default: Any = None) -> Any:
    """Return the first of ``paths`` present and not None on ``obj`` (for renamed fields)."""
    for path in paths:
        value = get_field(obj, path, _MISSING)
        if value is not _MISSING:
            return value
    return default


def _keyword_names(func: Callable[..., Any]) -> frozenset[str] | None:
    """Names ``func`` accepts as keywords; None when it takes ``**kwargs`` (any name)."""
    import inspect  # only when a patch first probes a signature: it costs a few ms to import

    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: accepts nothing we can prove
        return frozenset()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keywordable = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in keywordable)


_cached_keyword_names = functools.lru_cache(maxsize=1024)(_keyword_names)


def accepts_parameter(func: Callable[..., Any], name: str) -> bool:
    """Whether ``func`` can be called with keyword ``name``; ``**kwargs`` counts as accepting.

    Cached per callable, so it is cheap enough to ask inside a forward pass.
    """
    try:
        names = _cached_keyword_names(func)
    except TypeError:  # an unhashable callable cannot be cached
        names = _keyword_names(func)
    return names is None or name in names
