"""Finding the declared patches: the shipped catalogue and anything registered at run time.

The catalogue is found by listing ``patchkit.patches``: each sub-package is an upstream, and each of
its modules not starting with ``_`` is a declaration module exposing ``PATCHES``. Listing a folder
costs far less than scanning entry points, and adding a patch touches no central list.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from dataclasses import dataclass

from .declaration import Patch
from .errors import DeclarationError

logger = logging.getLogger(__name__)

CATALOGUE_PACKAGE = "patchkit.patches"


@dataclass(frozen=True)
class Registered:
    """A patch and the package its relative references resolve against."""

    patch: Patch
    package: str | None


@dataclass(frozen=True)
class CatalogueError:
    """A declaration module that could not be loaded; reported, never raised at start-up."""

    module: str
    error: str


def _declaration_modules(package_name: str) -> list[str]:
    package = importlib.import_module(package_name)
    names = []
    for upstream in pkgutil.iter_modules(package.__path__):
        if not upstream.ispkg or upstream.name.startswith("_"):
            continue
        upstream_package = importlib.import_module(f"{package_name}.{upstream.name}")
        for module in pkgutil.iter_modules(upstream_package.__path__):
            if not module.name.startswith("_") and not module.ispkg:
                names.append(f"{package_name}.{upstream.name}.{module.name}")
    return sorted(names)


def load(package_name: str = CATALOGUE_PACKAGE) -> tuple[list[Registered], list[CatalogueError]]:
    """Import every declaration module and collect its ``PATCHES``."""
    found: list[Registered] = []
    errors: list[CatalogueError] = []
    for module_name in _declaration_modules(package_name):
        try:
            module = importlib.import_module(module_name)
            patches = getattr(module, "PATCHES")
            if not all(isinstance(patch, Patch) for patch in patches):
                raise DeclarationError(f"{module_name}.PATCHES must hold Patch objects")
        except Exception as exc:  # a broken declaration must not take the host process down
            logger.error("patchkit: cannot load patch declarations from %s: %r", module_name, exc)
            errors.append(CatalogueError(module_name, repr(exc)))
            continue
        package = module_name.rpartition(".")[0]
        found.extend(Registered(patch, package) for patch in patches)
    return found, errors
