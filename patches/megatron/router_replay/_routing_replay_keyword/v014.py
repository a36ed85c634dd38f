"""``TransformerConfig.__init__`` taking ``enable_routing_replay`` on megatron-core 0.14/0.15.

These releases have no replay field; the value is set on the config object after upstream's
``__init__`` as ``moe_enable_routing_replay``, which ``megatron.router_replay``'s backport reads
(``router_replay.enable`` sets the same attribute).
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
        original(self, *args, **kwargs)
        if given:
            setattr(self, FIELD, value)

    __init__.__signature__ = KeywordSignature(original)  # type: ignore[attr-defined]
    return __init__
