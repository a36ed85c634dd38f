"""patchkit's loggers, without importing :mod:`logging` at start-up.

``import logging`` costs several milliseconds (it imports ``traceback``, ``tokenize``, ``string``,
``weakref``, ``threading`` ...), a large part of what ``import patchkit; patchkit.apply_all()`` may
add to an interpreter's start. A process that never imports ``logging`` can hear no record: there is
no handler to give it to, and the ``patchkit`` logger's ``NullHandler`` would swallow it anyway. So
the runtime's loggers are stand-ins (:func:`get`): a record sent while ``logging`` is not imported is
dropped, exactly as it would have gone nowhere; anything else (a record once ``logging`` is
imported, ``setLevel``, ``handlers``...) is the real ``logging.getLogger(name)``'s.

The ``patchkit`` logger's ``NullHandler`` (a library must not print through ``logging.lastResort``)
is added whenever ``logging`` is imported, by whomever, before any record of the ``patchkit``
namespace can be sent, a catalogue module's own logger included: :func:`arm` registers a
post-import hook on ``logging`` (at once if it is imported already).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    import logging
    from types import ModuleType
    from typing import Any

#: The logger every patchkit logger's records reach, and the one that carries the NullHandler.
ROOT = "patchkit"

#: The methods that send a record: dropped while ``logging`` is not imported (no one can hear them).
_SENDING = frozenset({"debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log"})


def _drop(*args: Any, **kwargs: Any) -> None:
    """A record sent before ``logging`` exists: there is no handler that could receive it."""


class _Logger:
    """Stands in for ``logging.getLogger(name)`` until ``logging`` is imported (see the module doc)."""

    __slots__ = ("name", "_logger")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: Any = None

    def __getattr__(self, attribute: str) -> Any:
        logger = self._logger
        if logger is None:
            if attribute in _SENDING and "logging" not in sys.modules:
                return _drop
            logger = self._logger = _real(self.name)
        return getattr(logger, attribute)

    def __repr__(self) -> str:
        return f"<patchkit logger {self.name!r}>"


def get(name: str) -> "logging.Logger":
    """The logger ``name`` (``patchkit`` or beneath it), importing ``logging`` only when it is needed."""
    found: logging.Logger = _Logger(name)  # type: ignore[assignment]  # it stands in for one
    return found


def _real(name: str) -> "logging.Logger":
    import logging

    _null_handler(logging)  # the hook may not have run yet: this import is the first, in flight
    return logging.getLogger(name)


def _null_handler(logging: "ModuleType") -> None:
    """Give the ``patchkit`` logger its ``NullHandler``, once."""
    ours = logging.getLogger(ROOT)
    if not any(type(handler) is logging.NullHandler for handler in ours.handlers):
        ours.addHandler(logging.NullHandler())


def arm() -> None:
    """Have the ``NullHandler`` added as soon as ``logging`` is imported (now, if it is)."""
    from . import hooks

    hooks.register("logging", _null_handler)
