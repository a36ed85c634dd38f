"""Fixtures for the matrix tooling: real distributions written to temp folders on ``sys.path``
(``tests/toy_distributions.py``), so the engine, ``record`` and the fingerprints see an installed upstream."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from toy_distributions import ToyDistribution, ToySites

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

#: The matrix the table and the grid are rendered from: a vLLM patch with a release verified by tests, one
#: checked statically, one native and one known bad, and a megatron-core patch verified on one release.
SMALL_MATRIX = """schema: 1
environments:
  e: {install: [], tests: [t]}
patches:
  vllm.refit:
    'vllm>=0.12,<0.16':
      - {versions: {vllm: '0.13.0'}, status: verified, verified_by: [static]}
      - {versions: {vllm: '0.12.0'}, status: verified, verified_by: ['tests:e']}
    'vllm>=0.16,<0.20':
      - {versions: {vllm: '0.16.0'}, status: native}
      - {versions: {vllm: '0.15.1'}, status: known-bad}
  megatron.fix:
    'megatron-core>=0.14,<0.20':
      - {versions: {megatron-core: '0.14.0'}, status: verified, verified_by: ['tests:e']}
"""


#: A toy upstream of the matrix tests (``name`` is its distribution).
Dist = ToyDistribution


@pytest.fixture
def make_dist(tmp_path: Path) -> Iterator[Callable[..., Dist]]:
    """``make(version, source, like=None)``: a toy upstream whose ``core`` is ``source``; ``like`` an earlier one,
    the same distribution and package again (the modified copy in front on ``sys.path``)."""
    sites = ToySites(tmp_path, "mx")

    def make(version: str = "1.2.3", source: str = SOURCE, like: Dist | None = None) -> Dist:
        return sites.make(version, source, like=like)

    yield make
    sites.close()


@pytest.fixture(autouse=True)
def _clean_patchkit_env(no_patchkit_switches: None) -> None:
    """Every test here runs without the switches of the shell that started it."""
