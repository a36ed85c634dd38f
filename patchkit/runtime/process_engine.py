"""The process-wide engine: the one ``patchkit.apply_all()``, autoload, manifests and self-checks use.

It is built from the shipped catalogue on first use, and the declaration modules named in
``PATCHKIT_EXTRA_PATCHES`` are registered with it by :func:`register_extra_patches`. Here, in the
runtime, rather than in the ``patchkit`` package itself, so the modules beneath that package
(``patchkit.processes``, ``patchkit.selfcheck``) reach it without importing back up into the package
that imports them.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping

from . import catalogue, settings
from .engine import Engine

_engine: Engine | None = None
_engine_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _engine_lock
    _engine_lock = threading.Lock()  # a thread that held it does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def engine() -> Engine:
    """The process-wide engine, loading the shipped catalogue on first use."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                patches, errors = catalogue.load()
                _engine = Engine(patches, errors)
    return _engine


def register_extra_patches(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], list[str]]:
    """Register the patches of the modules named in ``PATCHKIT_EXTRA_PATCHES`` with the engine.

    Each module is imported and its ``PATCHES`` registered, relative references resolving against
    the module's package, as for the catalogue: all of a module's patches, or none of them (one
    malformed patch, an id declared twice, or an id another declaration already registered keeps
    the whole module out). A module that fails is reported and skipped; the others still register.
    Returns the module names and the problems met. Raises ``ConfigError`` if the variable is malformed.
    """
    env = os.environ if environ is None else environ
    modules = settings.parse_modules(settings.EXTRA_PATCHES, env.get(settings.EXTRA_PATCHES, ""))
    problems = []
    found = engine()
    for name in modules:
        try:
            patches = catalogue.declarations(name)
            found.register_all(patches, name.rpartition(".")[0] or None, known_ok=True)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # one broken module (even one calling sys.exit) must not keep the others out
            problems.append(f"{settings.EXTRA_PATCHES}: cannot register patches from {name}: {exc!r}")
    return modules, problems
