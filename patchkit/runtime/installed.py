"""Whether an upstream distribution is installed, and its version as its metadata spells it.

Found without importing the upstream, and without parsing the version (:mod:`.versions` parses it
when a decision needs it): what start-up needs to tell a patch whose upstream is not installed from
one waiting for its upstream's code. Versions come from the distribution's metadata through
:mod:`.distinfo`; a source checkout without metadata has its ``__version__`` read once the module is
imported (patchkit never imports it to find out).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import ExtensionFileLoader, PathFinder, SourceFileLoader, SourcelessFileLoader

from . import distinfo

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

#: What :func:`find` answers (the values of :class:`.versions.Availability`).
INSTALLED = "installed"
MISSING = "missing"
#: Installed without metadata and not imported yet: its ``__version__`` is read on import.
DEFERRED = "deferred"


def find(distribution: str, module: str | None = None) -> tuple[str, str | None]:
    """(:data:`INSTALLED`, its version string), (:data:`MISSING`, None) or (:data:`DEFERRED`, None).

    ``module`` is its import package: if it cannot be found the distribution is missing (cheap).
    Without distribution metadata (a source checkout on ``sys.path``), the module's ``__version__``
    is used once the module is imported.
    """
    if module is not None and not _top_level_findable(module):
        return MISSING, None
    raw = distinfo.version(distribution)
    if raw is None and module is not None:
        imported = sys.modules.get(module)
        if imported is None:
            return (DEFERRED if _module_findable(module) else MISSING), None
        raw = getattr(imported, "__version__", None)
        if raw is None:
            package_info = sys.modules.get(f"{module}.package_info")
            raw = getattr(package_info, "__version__", None)
    if raw is None:
        return MISSING, None
    return INSTALLED, str(raw)


class Answers:
    """:func:`find`, each (distribution, import package) read once: one pass's answers (most patches
    of a family ask about the same distribution, and each answer costs a search of ``sys.path``)."""

    __slots__ = ("_found",)

    def __init__(self) -> None:
        self._found: dict[tuple[str, str | None], tuple[str, str | None]] = {}

    def __call__(self, distribution: str, module: str | None) -> tuple[str, str | None]:
        key = (distribution, module)
        answer = self._found.get(key)
        if answer is None:
            answer = self._found[key] = find(distribution, module)
        return answer


def _top_level_findable(module: str) -> bool:
    top = module.partition(".")[0]
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _module_findable(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it or its parents.

    ``importlib.util.find_spec("a.b")`` imports ``a`` (running its ``__init__``: all of vLLM's, say).
    Here each level is looked up in its parent's folders instead: the package's own folder, or every
    folder of a namespace package. Where the top level comes from a finder other than the path
    finder (an editable install's mapping finder), those folders may not tell, and the parents are
    imported as before.
    """
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
        if spec is None or len(parts) == 1:
            return spec is not None
        if spec.submodule_search_locations is None:
            return False
        if not _path_based(spec):
            return importlib.util.find_spec(module) is not None
        folders = list(spec.submodule_search_locations)
        for depth in range(1, len(parts)):
            try:
                child = PathFinder.find_spec(".".join(parts[: depth + 1]), folders)
                found = child is not None
                is_package = child is not None and child.submodule_search_locations is not None
            except KeyError:  # a namespace portion: its path object looks up the parent, not imported
                found = is_package = True
            if not found or depth == len(parts) - 1:
                return found
            if not is_package:
                return False  # a module: it has no children
            folders = [os.path.join(folder, parts[depth]) for folder in folders
                       if os.path.isdir(os.path.join(folder, parts[depth]))]
        return False
    except (ImportError, ValueError):
        return False


def _path_based(spec: ModuleSpec) -> bool:
    """Whether ``spec`` was found on ``sys.path`` (a source or namespace package), so its children are too."""
    namespace = spec.origin is None and spec.submodule_search_locations is not None
    return namespace or isinstance(spec.loader, (SourceFileLoader, SourcelessFileLoader, ExtensionFileLoader))
