"""Fixtures for the matrix tooling: real distributions written to temp folders on ``sys.path``.

``make_dist`` writes a package and a ``<name>-<version>.dist-info`` that ``importlib.metadata``
reads, so the engine, ``record`` and the fingerprints see an installed upstream. A second call with
the same names and changed source is the "modified copy in a temp dir on sys.path": it is put in
front, and the modules of the earlier copy are dropped from ``sys.modules``.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

_counter = itertools.count()

SOURCE = '''
class Model:
    """A model."""

    def forward(self, x):
        """Add one."""
        return x + 1

    def backward(self, x):
        return x - 1


class Child(Model):
    pass


def compute(x, scale=10):
    return x * scale
'''


@dataclass
class Dist:
    name: str
    package: str
    version: str
    root: Path

    @property
    def core(self) -> str:
        return f"{self.package}.core"

    def target(self, qualname: str) -> str:
        return f"{self.core}:{qualname}"


def _purge(package: str) -> None:
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


@pytest.fixture
def make_dist(tmp_path: Path) -> Iterator[Callable[..., Dist]]:
    roots: list[Path] = []
    packages: set[str] = set()

    def make(version: str = "1.2.3", source: str = SOURCE, like: Dist | None = None) -> Dist:
        n = next(_counter)
        name, package = (like.name, like.package) if like else (f"mxdist{n}", f"mxpkg{n}")
        root = tmp_path / f"site{n}"
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        (root / package / "core.py").write_text(textwrap.dedent(source))
        info = root / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        _purge(package)
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        roots.append(root)
        packages.add(package)
        return Dist(name, package, version, root)

    yield make
    for root in roots:
        sys.path.remove(str(root))
    for package in packages:
        _purge(package)
    importlib.invalidate_caches()


@pytest.fixture(autouse=True)
def _clean_patchkit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PATCHKIT_DISABLE", "PATCHKIT_ENABLE", "PATCHKIT_STRICT", "PATCHKIT_FORCE", "PATCHKIT_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
