"""Fixtures of real vLLM on CPU that tests/vllm and tests/e2e share, and patches applied for a test.

A conftest imports the fixtures by name and provides ``cpu_nvfp4_kernels`` (session-scoped: vLLM's
NVFP4 kernels registered for the CPU platform, ``vllm_cpu_harness.cpu_nvfp4_kernels``), which the
NVFP4 fixtures here are built on. tests/vllm enters it alone; tests/e2e enters it under Megatron's
parallel state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import vllm_cpu_harness

import patchkit


@contextlib.contextmanager
def installed(*patch_ids: str) -> Iterator[tuple[Any, ...]]:
    """``patch_ids`` applied through patchkit, each asserted installed (their records are yielded),
    reverted on exit."""
    with patchkit.applied(*patch_ids) as records:
        assert all(record.state.installed for record in records), [r.to_dict() for r in records]
        yield records


@pytest.fixture(scope="session")
def vllm_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with vllm_cpu_harness.vllm_cpu_config(tmp_path_factory.mktemp("tiny-llama")) as config:
        yield config


@pytest.fixture
def cpu_marlin_layout(cpu_nvfp4_kernels: None) -> Iterator[None]:
    with vllm_cpu_harness.cpu_marlin_layout():
        yield


@pytest.fixture
def nvfp4_refit_patch(cpu_nvfp4_kernels: None) -> Iterator[None]:
    """``vllm.nvfp4_refit`` applied for the test (before any serving layer is built), reverted after."""
    with installed("vllm.nvfp4_refit"):
        yield
