"""Trainer to rollout in one process: real megatron-core + ModelOpt (trainer) and real vLLM (serving), CPU.

Environment: compat_matrix.yaml ``e2e-vllm-0.29`` (Python 3.11, torch 2.13.0, megatron-core 0.16.1,
ModelOpt 0.47.0, vLLM 0.29.0, ``VLLM_TARGET_DEVICE=cpu``).

Both harnesses are reused unchanged: ``tests/vllm/vllm_cpu_harness.py`` (vLLM's NVFP4 emulation kernels
registered for the CPU platform; read its docstring) and the Megatron CPU stand-ins with patchkit's
CPU fake-quant backend (``tests/modelopt/qat_fixtures.py``). Both sides share one gloo process group
of one rank: vLLM's ``init_distributed_environment`` starts it, Megatron's parallel state is built on
top of it, and neither is torn down before the session ends (tearing Megatron's down would destroy
the group vLLM's groups were made from). Run tests/e2e in
its own pytest session (as its environment does): tests/export's fixtures destroy the process group
after each test, and tests/vllm starts its own vLLM distributed state.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("modelopt.torch.quantization")
pytest.importorskip("megatron.core")

TESTS = Path(__file__).resolve().parents[1]
for folder in ("e2e", "export", "modelopt", "vllm"):
    if str(TESTS / folder) not in sys.path:
        sys.path.insert(0, str(TESTS / folder))

import vllm_cpu_harness  # noqa: E402

vllm_cpu_harness.select_cpu_platform()

from qat_fixtures import cpu_backend  # noqa: E402,F401  (the CPU fake-quant backend fixture)
from vllm_fixtures import cpu_marlin_layout, nvfp4_refit_patch, vllm_config  # noqa: E402,F401


@pytest.fixture(scope="session")
def stack(vllm_config: object) -> Iterator[object]:  # noqa: F811  (the fixture imported above)
    """vLLM's model-parallel state and Megatron's (TP=PP=EP=1) on the same one-rank gloo group."""
    from megatron.core import parallel_state
    from megatron.core.transformer.moe import moe_utils
    from patchkit.patches.megatron._checks._cpu_stand_in import cpu_megatron, initialize_parallel_state

    if not hasattr(moe_utils, "te_general_gemm"):  # megatron-core 0.16.1 without TransformerEngine
        moe_utils.te_general_gemm = None
    with cpu_megatron():
        initialize_parallel_state()
    try:
        with vllm_cpu_harness.cpu_nvfp4_kernels():
            yield vllm_config
    finally:
        parallel_state.destroy_model_parallel()


@pytest.fixture(scope="session")
def cpu_nvfp4_kernels(stack: object) -> None:
    """vLLM's NVFP4 kernels on CPU: ``stack`` registers them, on top of Megatron's parallel state."""
