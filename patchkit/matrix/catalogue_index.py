"""The catalogue's index, ``patches/_index.py`` and ``patches/_index_declarations.py``: generated here.

``apply_all()`` must not import every declaration module to learn what the catalogue holds (start-up
would grow with every patch). So the generator imports them all once and writes two modules of
constants (their cached bytecode loads without running code): ``_index`` holds, per declaration
module, each patch's id, ``opt_in``, distributions (with their import packages) and the modules its
variants install into, which is all start-up reads, and the listing of every catalogue folder it was
made from, so the runtime notices a module added since by listing the folders alone;
``_index_declarations`` holds each declaration whole, as data, read only once a patch needs more
(a decision, ``list``, ``explain``). See :mod:`patchkit.runtime.catalogue`.

``patchkit matrix catalogue`` rewrites them, ``--check`` fails when they are stale, and so do
``patchkit matrix check`` and the test suite. Nothing here is imported at start-up.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from ..runtime import catalogue
from ..runtime.declaration import Patch
from ..runtime.errors import DeclarationError

INDEX_HEADER = '''# ruff: noqa: E501
"""Generated from the declaration modules by `patchkit matrix catalogue`: the catalogue's index.

Do not edit: the test suite and `patchkit matrix check` fail when this is out of step with the
declarations. Read at start-up by patchkit.runtime.catalogue, which imports a declaration module only
when one of its patches is about to install. Constants only, so its cached bytecode loads without
running code. FOLDERS: each catalogue folder (relative, dotted) and its public names when this was
written. DECLARATIONS: each declaration module (relative, dotted) and its patches, each
(id, opt_in, ((distribution, import package), ...), the modules its variants install into).
"""
'''

DECLARATIONS_HEADER = '''# ruff: noqa: E501
"""Generated from the declaration modules by `patchkit matrix catalogue`: every declaration, as data.

Do not edit (see _index.py). Read by patchkit.runtime.catalogue the first time a patch of the index
needs more than its summary there: DECLARATIONS[patch id] is its declaration's fields, in Patch
field order (patchkit.runtime.catalogue.patch_from_data).
"""
'''


def folder(package_name: str = catalogue.CATALOGUE_PACKAGE) -> Path:
    """Where the index of ``package_name`` lives: beside its ``__init__.py``."""
    package = importlib.import_module(package_name)
    return Path(next(iter(package.__path__)))


def _data(patch: Patch) -> tuple[Any, ...]:
    normal = catalogue.normalized(patch)
    data = catalogue.declaration_data(normal)
    if catalogue.patch_from_data(data) != normal or not _plain(data):
        raise DeclarationError(f"{patch.id}: only plain data can be written into the catalogue's index (a "
                               f"catalogue declaration references code by 'module:name' strings), got {patch!r}")
    return data


def _plain(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_plain(item) for item in value)
    return value is None or type(value) in (str, bool)


def _declared(package_name: str) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[Patch, ...]]]:
    """The folders' listings and every declaration module's patches (each module imported)."""
    listed = catalogue.folders(package_name)
    modules = {}
    for relative in catalogue.declaration_modules(package_name, listed):
        module_name = f"{package_name}.{relative}"
        try:
            modules[relative] = catalogue.declarations(module_name)
        except Exception as exc:
            raise DeclarationError(f"cannot index {module_name}: {exc!r}") from exc
    return listed, modules


def render(package_name: str = catalogue.CATALOGUE_PACKAGE) -> dict[str, str]:
    """The index of ``package_name`` as it should be now, by file name (the index and its companion
    holding every declaration as data); every declaration module is imported to write it. Raises
    ``DeclarationError`` if one cannot be loaded (an index must not leave a patch out)."""
    listed, modules = _declared(package_name)
    index = [INDEX_HEADER.rstrip("\n"), "", f"FORMAT = {catalogue.INDEX_FORMAT}", "", "FOLDERS = {"]
    index.extend(f"    {folder!r}: {names!r}," for folder, names in listed.items())
    index += ["}", "", "DECLARATIONS = {"]
    data = [DECLARATIONS_HEADER.rstrip("\n"), "", "DECLARATIONS = {"]
    for relative, patches in modules.items():
        index.append(f"    {relative!r}: (")
        index.extend(f"        {catalogue.indexed_summary(catalogue.normalized(patch))!r}," for patch in patches)
        index.append("    ),")
        for patch in patches:
            data.append(f"    {patch.id!r}: (")
            data.extend(f"        {field!r}," for field in _data(patch))
            data.append("    ),")
    index.append("}")
    data.append("}")
    return {f"{catalogue.INDEX_MODULE}.py": "\n".join(index) + "\n",
            f"{catalogue.DECLARATIONS_MODULE}.py": "\n".join(data) + "\n"}


def current(package_name: str = catalogue.CATALOGUE_PACKAGE) -> dict[str, str]:
    """The index's files on disk, by name ("" for one that is missing)."""
    where = folder(package_name)
    return {name: (where / name).read_text(encoding="utf-8") if (where / name).is_file() else ""
            for name in (f"{catalogue.INDEX_MODULE}.py", f"{catalogue.DECLARATIONS_MODULE}.py")}


def is_stale(package_name: str = catalogue.CATALOGUE_PACKAGE) -> bool:
    return current(package_name) != render(package_name)


def write(package_name: str = catalogue.CATALOGUE_PACKAGE) -> bool:
    """Rewrite the index if it is stale; True if it changed. Drops the old bytecode with it."""
    new = render(package_name)
    old = current(package_name)
    if old == new:
        return False
    where = folder(package_name)
    for name, text in new.items():
        if old[name] == text:
            continue
        target = where / name
        tmp = target.with_suffix(".py.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
        # Bytecode is validated by the source's mtime in whole seconds and its size: a rewrite within
        # the same second at the same size would otherwise load the old index.
        with contextlib.suppress(FileNotFoundError):
            os.remove(importlib.util.cache_from_source(str(target)))
    importlib.invalidate_caches()
    return True
