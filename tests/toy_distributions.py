"""Real, installed-on-the-fly distributions for tests that need an upstream whose version and code they control.

Each is a package with a ``core`` module and a ``<name>-<version>.dist-info`` that ``importlib.metadata``
reads, written to a site folder of its own and put in front on ``sys.path``: the engine, ``record`` and the
fingerprints see an installed upstream, and no part of patchkit is replaced. A release made ``like`` an
earlier one (same distribution and package, other version or code) is the "modified copy in front on
sys.path": the modules of the earlier copy are dropped from ``sys.modules``.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

_counter = itertools.count()


@dataclass(frozen=True)
class ToyDistribution:
    """Distribution ``name`` (its metadata name) at ``version``, providing package ``package`` from ``root``."""

    name: str
    package: str
    version: str
    root: Path

    @property
    def core(self) -> str:
        return f"{self.package}.core"

    def target(self, qualname: str) -> str:
        return f"{self.core}:{qualname}"

    def import_core(self) -> ModuleType:
        return importlib.import_module(self.core)


def _forget(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


class ToySites:
    """Writes toy distributions under ``folder``; :meth:`close` takes them off ``sys.path`` and forgets
    their modules."""

    def __init__(self, folder: Path, prefix: str) -> None:
        self._folder = folder
        self._prefix = prefix
        self._made: list[ToyDistribution] = []

    def make(self, version: str, core_source: str, *, metadata: bool = True, name: str | None = None,
             like: ToyDistribution | None = None) -> ToyDistribution:
        """A new site folder in front on ``sys.path`` with the package (``core_source`` as its ``core``, dedented)
        and, with ``metadata``, its ``.dist-info``. Names are fresh unless ``name`` or ``like`` give them."""
        n = next(_counter)
        package = like.package if like else f"{self._prefix}{n}"
        name = like.name if like else (name or f"{self._prefix}-dist{n}")
        root = self._folder / f"site{n}"
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        (root / package / "core.py").write_text(textwrap.dedent(core_source))
        if metadata:
            info = root / f"{name.replace('-', '_')}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        _forget(package)
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        made = ToyDistribution(name, package, version, root)
        self._made.append(made)
        return made

    def close(self) -> None:
        for made in self._made:
            sys.path.remove(str(made.root))
            _forget(made.package)
        importlib.invalidate_caches()
