"""One error tree: every error patchkit or its catalogue raises on purpose is a ``patchkit.PatchkitError``,
and nothing that is not an exception is named like one.

Imported, not read: the public API modules of the catalogue (the family packages ``router_replay``, ``mtp``,
``qat``, ``refit``, ...) and each family's ``_errors`` leaf import neither torch nor an upstream, so
this runs in the engine environment. Public API modules are found by listing ``patches/`` (a public
module that declares no ``PATCHES``), so a new one is walked the day it is added.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import patchkit
import patchkit.runtime
from patchkit import PatchkitError
from patchkit.runtime.catalogue import declares_patches

CATALOGUE = Path(__file__).resolve().parents[2] / "patches"


def _catalogue_modules() -> list[str]:
    """Each upstream's ``_errors`` leaf and every public API: a family package, or a public module
    that declares no ``PATCHES``."""
    names = []
    for upstream in sorted(p for p in CATALOGUE.iterdir() if (p / "__init__.py").exists()):
        for path in sorted(upstream.iterdir()):
            dotted = f"patchkit.patches.{upstream.name}.{path.stem}"
            if path.is_dir() and (path / "__init__.py").exists() and not path.name.startswith("_"):
                names.append(dotted)
                names += [f"{dotted}.{module.stem}" for module in sorted(path.glob("[!_]*.py"))
                          if not declares_patches(str(module))]
            elif path.suffix == ".py" and (path.stem == "_errors" or (
                    not path.stem.startswith("_") and not declares_patches(str(path)))):
                names.append(dotted)
    return names


def _exported_errors(module_name: str) -> list[type[BaseException]]:
    """The exception classes ``module_name`` offers its callers, patchkit's own base classes aside.

    Names a module reaches lazily (PEP 562: they import torch or an upstream) are not looked up:
    errors are bound at import, so that a caller can catch them without the upstream.
    """
    module = importlib.import_module(module_name)
    bound = vars(module)
    public = getattr(module, "__all__", [n for n in bound if not n.startswith("_")])
    return [value for value in (bound[name] for name in public if name in bound)
            if inspect.isclass(value) and issubclass(value, BaseException)
            and value.__module__.startswith("patchkit.patches.")]


CATALOGUE_MODULES = _catalogue_modules()


def test_the_walk_finds_the_catalogues_errors():
    found = {cls.__name__ for name in CATALOGUE_MODULES for cls in _exported_errors(name)}
    # The ones the issue named: refit, router replay, QAT export, MTP.
    assert {"RefitError", "RouterReplayError", "QATExportError", "MTPOptionError", "MTPModelError"} <= found


@pytest.mark.parametrize("module_name", CATALOGUE_MODULES)
def test_every_public_error_of_the_catalogue_is_a_patchkit_error(module_name):
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in _exported_errors(module_name)
               if not issubclass(cls, PatchkitError)]
    assert outside == []


@pytest.mark.parametrize("module_name", CATALOGUE_MODULES)
def test_public_modules_re_export_the_errors_leafs_classes(module_name):
    """``from patchkit.patches.megatron.router_replay import RouterReplayError`` still works and
    is the one class (catching it catches what every module of the family raises)."""
    for cls in _exported_errors(module_name):
        assert cls.__module__.endswith("._errors"), f"{cls.__qualname__} is defined in {cls.__module__}"


def _runtime_modules() -> list[str]:
    names = ["patchkit", "patchkit.selfcheck"]
    names += [f"patchkit.runtime.{info.name}" for info in pkgutil.iter_modules(patchkit.runtime.__path__)]
    return names


@pytest.mark.parametrize("module_name", _runtime_modules() + CATALOGUE_MODULES)
def test_a_class_named_like_an_error_is_an_exception(module_name):
    module = importlib.import_module(module_name)
    lying = [cls.__qualname__ for cls in vars(module).values()
             if inspect.isclass(cls) and cls.__name__.endswith("Error") and not issubclass(cls, BaseException)]
    assert lying == []
