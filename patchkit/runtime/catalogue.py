"""Finding the declared patches: the shipped catalogue and anything registered at run time.

The catalogue is found by listing ``patchkit.patches``: each sub-package is an upstream, and each of
its modules not starting with ``_`` is a declaration module exposing ``PATCHES``. Listing a folder
costs far less than scanning entry points, and adding a patch touches no central list.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import NamedTuple

from .declaration import Patch, validate
from .errors import DeclarationError

logger = logging.getLogger(__name__)

CATALOGUE_PACKAGE = "patchkit.patches"


class Registered(NamedTuple):
    """A patch and the package its relative references resolve against."""

    patch: Patch
    package: str | None


class CatalogueError(NamedTuple):
    """A declaration module that could not be loaded; reported, never raised at start-up."""

    module: str
    error: str


def _public_children(package_name: str) -> list[tuple[str, bool]]:
    """(name, is_package) of a package's children not starting with '_', from its folders."""
    children = {}
    for folder in importlib.import_module(package_name).__path__:
        for entry in os.scandir(folder):
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir() and os.path.exists(os.path.join(entry.path, "__init__.py")):
                children[entry.name] = True
            elif entry.is_file() and entry.name.endswith(".py"):
                children[entry.name[:-3]] = False
    return sorted(children.items())


def _declaration_modules(package_name: str) -> list[str]:
    # os.scandir rather than pkgutil: same answer for source folders, without pkgutil's import cost.
    return [
        f"{package_name}.{upstream}.{module}"
        for upstream, is_package in _public_children(package_name) if is_package
        for module, is_subpackage in _public_children(f"{package_name}.{upstream}") if not is_subpackage
    ]


def declarations(module_name: str) -> tuple[Patch, ...]:
    """The validated ``PATCHES`` of one declaration module; raises if any is malformed or two share
    an id (all valid, or none registered)."""
    module = importlib.import_module(module_name)
    patches = tuple(module.PATCHES)
    seen: set[str] = set()
    for patch in patches:
        if not isinstance(patch, Patch):
            raise DeclarationError(f"{module_name}.PATCHES must hold Patch objects, got {patch!r}")
        validate(patch)
        if patch.id in seen:
            raise DeclarationError(f"{module_name} declares patch id {patch.id!r} twice; none of its patches "
                                   f"is registered")
        seen.add(patch.id)
    return patches


def load(package_name: str = CATALOGUE_PACKAGE) -> tuple[list[Registered], list[CatalogueError]]:
    """Import every declaration module and collect its ``PATCHES``."""
    found: list[Registered] = []
    errors: list[CatalogueError] = []
    for module_name in _declaration_modules(package_name):
        try:
            patches = declarations(module_name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken declaration (even one calling sys.exit) must not end the host
            logger.error("patchkit: cannot load patch declarations from %s: %r", module_name, exc)
            errors.append(CatalogueError(module_name, repr(exc)))
            continue
        package = module_name.rpartition(".")[0]
        found.extend(Registered(patch, package) for patch in patches)
    return found, errors
