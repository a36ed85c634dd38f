"""Fixtures for tests against the real nvidia-modelopt (and megatron-core) on CPU: see ``qat_fixtures``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("modelopt.torch.quantization")
pytest.importorskip("megatron.core")

# ModelOpt 0.48 registers Megatron's linears only if TransformerEngine imports: tests/te_harness.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from te_harness import load_modelopt_megatron_plugin  # noqa: E402

load_modelopt_megatron_plugin()

from megatron_gpu_setup import megatron_gpu  # noqa: E402,F401  (the GPU tests' fixture)
from qat_fixtures import cpu_backend, megatron_cpu, tiny_moe_gpt  # noqa: E402,F401
