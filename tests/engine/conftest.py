"""Fixtures for engine tests: real, installed-on-the-fly distributions.

The engine's own tests need upstreams whose versions and code they control: each test gets fresh
distributions (``tests/toy_distributions.py``) whose ``core`` module has a class and functions to patch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from toy_distributions import ToyDistribution, ToySites

from patchkit import Engine

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


@pytest.fixture
def make_upstream(tmp_path: Path) -> Iterator[Callable[..., ToyDistribution]]:
    """``make(version, *, metadata=True, name=None, like=None, change=None)``: a toy upstream at ``version``;
    ``like`` an earlier one, the same distribution again with ``change`` (old, new) made to its code."""
    sites = ToySites(tmp_path, "toyup")

    def make(version: str = "1.2.3", *, metadata: bool = True, name: str | None = None,
             like: ToyDistribution | None = None, change: tuple[str, str] | None = None) -> ToyDistribution:
        source = UPSTREAM_SOURCE.format(version=version)
        return sites.make(version, source.replace(*change) if change else source, metadata=metadata, name=name,
                          like=like)

    yield make
    sites.close()


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = Engine()
    yield eng
    eng.revert_all()


@pytest.fixture(autouse=True)
def _clean_patchkit_env(no_patchkit_switches: None) -> None:
    """Every test here runs without the switches of the shell that started it."""
