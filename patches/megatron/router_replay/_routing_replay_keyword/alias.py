"""The ``enable_routing_replay`` name on megatron-core configs: error, signature and attribute alias.

Shared by both variants of ``megatron.routing_replay_keyword``. The alias is a class property, not
a dataclass field: ``dataclasses.fields``, ``asdict``, ``repr`` and equality stay upstream's.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..._errors import RoutingReplayKeywordConflict

KEYWORD = "enable_routing_replay"
FIELD = "moe_enable_routing_replay"


def take_keyword(kwargs: dict[str, Any]) -> tuple[bool, Any]:
    """Remove ``enable_routing_replay`` from ``kwargs``: (whether it was given, its value). Raises
    :class:`RoutingReplayKeywordConflict`, leaving ``kwargs`` as it was, when the field keyword
    disagrees."""
    if KEYWORD not in kwargs:
        return False, None
    value = kwargs[KEYWORD]
    if FIELD in kwargs and bool(kwargs[FIELD]) != bool(value):
        raise RoutingReplayKeywordConflict(value, kwargs[FIELD])
    del kwargs[KEYWORD]
    return True, value


def with_keyword(original: Any) -> inspect.Signature:
    """``original``'s signature with a keyword-only ``enable_routing_replay=False`` (before ``**kwargs``),
    so wrappers that filter keywords by signature (MindSpeed) let it through."""
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    if KEYWORD in signature.parameters:
        return signature
    added = inspect.Parameter(KEYWORD, inspect.Parameter.KEYWORD_ONLY, default=False)
    at = len(parameters) - 1 if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD else len(parameters)
    parameters.insert(at, added)
    return signature.replace(parameters=parameters)


class KeywordSignature(inspect.Signature):
    """:func:`with_keyword` of ``original``, worked out when something first reads it.

    ``TransformerConfig.__init__`` has hundreds of parameters: building its signature costs
    milliseconds, paid at install time by every process although only a wrapper that filters
    keywords by signature ever reads it.
    """

    __slots__ = ("_original", "_made")

    def __init__(self, original: Any) -> None:  # the fields live in the signature made on first use
        self._original = original
        self._made: inspect.Signature | None = None

    def _signature(self) -> inspect.Signature:
        if self._made is None:
            self._made = with_keyword(self._original)
        return self._made

    # Signature's own methods read these two fields directly (``replace``, ``__eq__``, ``__str__``).
    @property  # type: ignore[override]
    def _parameters(self) -> Any:
        return self._signature().parameters

    @property  # type: ignore[override]
    def _return_annotation(self) -> Any:
        return self._signature().return_annotation

    def replace(self, **changes: Any) -> inspect.Signature:  # type: ignore[override]
        return self._signature().replace(**changes)

    __replace__ = replace  # copy.replace (3.13+)

    def __reduce__(self) -> Any:  # pickled as the plain signature it stands for
        return self._signature().__reduce__()


def _get(config: Any) -> bool:
    return bool(getattr(config, FIELD, False))


def _set(config: Any, value: Any) -> None:
    setattr(config, FIELD, value)


ENABLE_ROUTING_REPLAY = property(_get, _set, doc="Older name of ``moe_enable_routing_replay`` (patchkit alias).")
