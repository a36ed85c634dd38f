"""Fixtures for engine tests: real, installed-on-the-fly distributions.

The engine's own tests need upstreams whose versions and code they control. Each test gets a fresh
distribution written to a temp folder on ``sys.path``: a ``<name>-<version>.dist-info`` with real
metadata that ``importlib.metadata`` reads, and a package with a class and functions to patch. No
part of the engine is replaced.
"""

from __future__ import annotations

import importlib
import itertools
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from patchkit import Engine

_counter = itertools.count()

UPSTREAM_SOURCE = '''
__version__ = "{version}"

class Model:
    def forward(self, x):
        return x + 1

    def backward(self, x):
        return x - 1

    @staticmethod
    def scale(x):
        return x * 2


class Child(Model):
    pass


def compute(x):
    return x * 10
'''


@dataclass
class ToyUpstream:
    """A real installed distribution: ``dist`` (metadata name) providing package ``package``."""

    dist: str
    package: str
    version: str
    root: Path

    @property
    def core(self) -> str:
        return f"{self.package}.core"

    def target(self, qualname: str) -> str:
        return f"{self.core}:{qualname}"

    def import_core(self):
        return importlib.import_module(self.core)


@pytest.fixture
def make_upstream(tmp_path: Path) -> Iterator:
    created: list[ToyUpstream] = []

    def make(version: str = "1.2.3", *, metadata: bool = True, dist: str | None = None) -> ToyUpstream:
        n = next(_counter)
        package = f"toyup{n}"
        dist_name = dist or f"toyup-dist{n}"
        root = tmp_path / f"site{n}"
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f'__version__ = "{version}"\n')
        (root / package / "core.py").write_text(textwrap.dedent(UPSTREAM_SOURCE.format(version=version)))
        if metadata:
            info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
        sys.path.insert(0, str(root))
        importlib.invalidate_caches()
        upstream = ToyUpstream(dist_name, package, version, root)
        created.append(upstream)
        return upstream

    yield make
    for upstream in created:
        sys.path.remove(str(upstream.root))
        for name in [m for m in sys.modules if m == upstream.package or m.startswith(upstream.package + ".")]:
            del sys.modules[name]
    importlib.invalidate_caches()


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = Engine()
    yield eng
    eng.revert_all()


@pytest.fixture(autouse=True)
def _clean_patchkit_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PATCHKIT_DISABLE", "PATCHKIT_ENABLE", "PATCHKIT_STRICT", "PATCHKIT_FORCE", "PATCHKIT_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
