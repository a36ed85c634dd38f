"""``TransformerConfig.__init__`` taking ``enable_routing_replay`` on megatron-core 0.16+.

The keyword is passed on as ``moe_enable_routing_replay`` (the dataclass field since 0.16), so
upstream's ``__init__`` and ``__post_init__`` see the value exactly as if it had been given by that name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from .alias import FIELD, KeywordSignature, take_keyword


def wrap_init(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given, value = take_keyword(kwargs)
        if given:
            kwargs[FIELD] = value
        original(self, *args, **kwargs)

    __init__.__signature__ = KeywordSignature(original)  # type: ignore[attr-defined]
    return __init__
