"""Fixtures for the vLLM tests: real vLLM on CPU, set up by ``vllm_cpu_harness`` (read it for what the
harness changes). Environment: compat_matrix.yaml ``vllm-0.24`` / ``vllm-0.33``.

Without vLLM (or torch) installed, every test module here is reported skipped: the modules are not
imported, and this conftest imports neither. A skip raised while pytest loads a conftest would
abort ``pytest tests/vllm`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    import vllm
except ImportError as missing:
    _VLLM_MISSING: ImportError | None = missing
else:
    # In one ``pytest tests/`` session another folder's conftest puts tests/ on sys.path, where this
    # folder imports as a namespace package named ``vllm`` (no ``__file__``): that is not vLLM.
    _VLLM_MISSING = None if getattr(vllm, "__file__", None) else ImportError("only tests/vllm is importable as vllm")


class _SkippedWithoutVllm(pytest.Module):
    def collect(self) -> list[pytest.Item]:
        pytest.skip(f"vLLM is not installed ({_VLLM_MISSING})")


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if _VLLM_MISSING is None:
        return None
    return _SkippedWithoutVllm.from_parent(parent, path=module_path)


if _VLLM_MISSING is None:
    import vllm_cpu_harness

    vllm_cpu_harness.select_cpu_platform()

    from vllm_fixtures import cpu_marlin_layout, installed, nvfp4_refit_patch, vllm_config  # noqa: F401


@pytest.fixture(scope="session")
def cpu_nvfp4_kernels(vllm_config: object) -> Iterator[None]:
    with vllm_cpu_harness.cpu_nvfp4_kernels():
        yield


@pytest.fixture
def cpu_fp8_ops(vllm_config: object) -> Iterator[None]:
    """Per test: its kernel redirects (Triton experts on CPU) must not reach the NVFP4 MoE tests' oracle."""
    with vllm_cpu_harness.cpu_fp8_ops():
        yield


@pytest.fixture
def cpu_dynamic_fp8_quant(vllm_config: object) -> Iterator[None]:
    with vllm_cpu_harness.cpu_dynamic_fp8_quant():
        yield


@pytest.fixture
def fp8_refit_patch(cpu_fp8_ops: None) -> Iterator[None]:
    """``vllm.fp8_refit`` applied for the test, reverted after."""
    with installed("vllm.fp8_refit"):
        yield


@pytest.fixture
def fp8_online_refit_patch(cpu_fp8_ops: None) -> Iterator[None]:
    """``vllm.fp8_online_refit`` applied for the test, reverted after (its module imported first, so it
    installs now)."""
    import vllm.model_executor.layers.quantization.online.fp8  # noqa: F401

    with installed("vllm.fp8_online_refit"):
        yield


@pytest.fixture(autouse=True)
def sigint_raises(python_sigint_handler: None) -> None:
    """Python's own SIGINT handler for every test here (``python_sigint_handler``): the refit's signal
    tests send real SIGINTs."""
