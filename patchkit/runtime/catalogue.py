"""Finding the declared patches: the shipped catalogue and anything registered at run time.

The catalogue is found by listing ``patchkit.patches``: each sub-package is an upstream, each of its
sub-packages a family, and each of their modules not starting with ``_`` whose source assigns
``PATCHES`` at top level is a declaration module. Listing a folder costs far less than scanning entry
points, and adding a patch touches no central list. Public helper modules beside them (a family
package's ``__init__``, ``plugin``: APIs for frameworks) assign no ``PATCHES`` and so are neither
declarations nor imported at start-up.
Modules named in ``PATCHKIT_EXTRA_PATCHES`` are imported by name and must define ``PATCHES``.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from typing import NamedTuple

from .declaration import Patch, validate
from .errors import DeclarationError

logger = logging.getLogger(__name__)

CATALOGUE_PACKAGE = "patchkit.patches"


class Registered(NamedTuple):
    """A patch and the package its relative references resolve against."""

    patch: Patch
    package: str | None


class CatalogueLoadFailure(NamedTuple):
    """A declaration module that could not be loaded: a record (reported, never raised at start-up),
    not an exception, hence not named ``...Error``."""

    module: str
    error: str


#: The record's former name, kept for callers (``engine.py`` among them) until they use the new one.
CatalogueError = CatalogueLoadFailure


#: A top-level assignment of ``PATCHES`` (``PATCHES = (`` or ``PATCHES: tuple[Patch, ...] = (``),
#: at the start of a line, so one inside a function, a docstring's indented example or a comment
#: does not count.
_ASSIGNS_PATCHES = re.compile(rb"^PATCHES[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)


def declares_patches(path: str) -> bool:
    """Whether the module source at ``path`` assigns ``PATCHES`` at top level (a declaration module).

    Read from the file rather than by importing it, so helper modules are never imported at
    start-up and a declaration module that fails to import is still found (and reported).
    """
    with open(path, "rb") as source:
        return _ASSIGNS_PATCHES.search(source.read()) is not None


def _public_children(package_name: str) -> list[tuple[str, str, bool]]:
    """(name, path, is_package) of a package's children not starting with '_', from its folders."""
    children = {}
    for folder in importlib.import_module(package_name).__path__:
        for entry in os.scandir(folder):
            if entry.name.startswith(("_", ".")):
                continue
            if entry.is_dir() and os.path.exists(os.path.join(entry.path, "__init__.py")):
                children[entry.name] = (entry.path, True)
            elif entry.is_file() and entry.name.endswith(".py"):
                children[entry.name[:-3]] = (entry.path, False)
    return [(name, path, is_package) for name, (path, is_package) in sorted(children.items())]


def _declaration_modules(package_name: str, depth: int = 2) -> list[str]:
    """Declaration modules below ``package_name``: in its upstream packages, and one family package deeper."""
    # os.scandir rather than pkgutil: same answer for source folders, without pkgutil's import cost.
    found = []
    for name, path, is_package in _public_children(package_name):
        if is_package and depth:
            found.extend(_declaration_modules(f"{package_name}.{name}", depth - 1))
        elif not is_package and depth < 2 and declares_patches(path):
            found.append(f"{package_name}.{name}")
    return found


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


def load(package_name: str = CATALOGUE_PACKAGE) -> tuple[list[Registered], list[CatalogueLoadFailure]]:
    """Import every declaration module and collect its ``PATCHES``."""
    found: list[Registered] = []
    errors: list[CatalogueLoadFailure] = []
    for module_name in _declaration_modules(package_name):
        try:
            patches = declarations(module_name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken declaration (even one calling sys.exit) must not end the host
            logger.error("patchkit: cannot load patch declarations from %s: %r", module_name, exc)
            errors.append(CatalogueLoadFailure(module_name, repr(exc)))
            continue
        package = module_name.rpartition(".")[0]
        found.extend(Registered(patch, package) for patch in patches)
    return found, errors
