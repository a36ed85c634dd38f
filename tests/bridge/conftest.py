"""Fixtures for the Megatron-Bridge export patches, against the real megatron-bridge on CPU.

Megatron-Bridge is installed with ``--no-deps`` (its hard dependencies include TransformerEngine and
mamba-ssm) and imported inside ``te_harness.te_import_stub`` (see ``tests/te_harness.py``). ModelOpt's
Megatron plugin is loaded first (``load_modelopt_megatron_plugin``): Bridge imports ModelOpt, and
ModelOpt 0.48 would otherwise meet the stub half-way through registering its Megatron modules.
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from te_harness import bridge_import_context, load_modelopt_megatron_plugin  # noqa: E402

if importlib.util.find_spec("modelopt") is not None:
    load_modelopt_megatron_plugin()

with bridge_import_context():
    import megatron.bridge  # noqa: F401
    import megatron.bridge.models.conversion.model_bridge  # noqa: F401
    import megatron.bridge.models.conversion.param_mapping  # noqa: F401
    import megatron.bridge.models.gpt_provider  # noqa: F401

pytest.importorskip("modelopt.torch.quantization")
from qat_fixtures import cpu_backend, megatron_cpu, tiny_moe_gpt  # noqa: E402,F401
