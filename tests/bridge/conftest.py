"""Fixtures for the Megatron-Bridge export patches, against the real megatron-bridge on CPU.

Megatron-Bridge is installed with ``--no-deps`` (its hard dependencies include TransformerEngine and
mamba-ssm) and imported inside ``te_stub.bridge_import_context`` (see ``te_stub``'s docstring).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("megatron.core")
if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "megatron"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "modelopt"))

from te_stub import bridge_import_context  # noqa: E402

with bridge_import_context():
    import megatron.bridge  # noqa: F401
    import megatron.bridge.models.conversion.model_bridge  # noqa: F401
    import megatron.bridge.models.conversion.param_mapping  # noqa: F401
    import megatron.bridge.models.gpt_provider  # noqa: F401

pytest.importorskip("modelopt.torch.quantization")
from qat_fixtures import cpu_backend, megatron_cpu, tiny_moe_gpt  # noqa: E402,F401
