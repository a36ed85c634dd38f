"""Fixtures for tests against the real nvidia-modelopt (and megatron-core) on CPU: see ``qat_fixtures``."""

from __future__ import annotations

import pytest

pytest.importorskip("modelopt.torch.quantization")
pytest.importorskip("megatron.core")

from qat_fixtures import cpu_backend, megatron_cpu, tiny_moe_gpt  # noqa: E402,F401
