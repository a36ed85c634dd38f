"""Fixtures for the QAT export tests: real megatron-core and ModelOpt on CPU (see ``export_models``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("modelopt.torch.quantization")
pytest.importorskip("megatron.core")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modelopt"))
from qat_fixtures import cpu_backend, megatron_cpu  # noqa: E402,F401
