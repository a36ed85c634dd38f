"""Tests that need both nvidia-modelopt and vLLM in one environment (compat_matrix.yaml
``modelopt-0.45-vllm-0.24``, ``e2e-vllm-0.29``): ModelOpt's vLLM plugin. vLLM runs on CPU
(``VLLM_TARGET_DEVICE=cpu``, set by those environments)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")
pytest.importorskip("modelopt.torch.quantization")
