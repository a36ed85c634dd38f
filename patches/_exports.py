"""Lazy exports for a family's public API: ``__getattr__`` and ``__dir__`` of a family package.

A family package (``patchkit.patches.<upstream>.<family>``) is its public API, and it is also the
package its declaration modules sit in: importing it must cost nothing, because the catalogue imports
every declaration at start-up. So the package names each public name and the private module that
defines it, and the module is imported on first access (PEP 562); ``from
patchkit.patches.megatron.router_replay import pack`` imports ``torch`` then, not before.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, answering each name of ``exports`` from its module.

    ``exports`` maps a public name to the module defining it, relative to ``package`` (``"._api"``,
    ``".._errors"``). A value is cached in the package's namespace after its first access.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
