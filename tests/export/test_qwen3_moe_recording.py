"""The recorded Qwen3-MoE export the vLLM tests load is what ``export_qat_weights`` writes today.

``qwen3_moe_recording`` records it (environment ``export-bridge-0.6``: Megatron-Bridge 0.6.2); the
vLLM environments only read it. Re-recording here and comparing byte for byte keeps the file honest:
a change to the export, its config or the Bridge shows up as a failure, and is then re-recorded on
purpose (``python tests/export/qwen3_moe_recording.py``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import torch

if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed", allow_module_level=True)

from qwen3_moe_recording import LAYOUTS, RECORDING, record, trained_model  # noqa: E402


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def _assert_same_stream(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]) -> None:
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, mine), (_, theirs) in zip(got, want, strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert torch.equal(_bits(mine), _bits(theirs)), name


def _with_producer(quant_config: dict, producer: dict) -> dict:
    return {**quant_config, "hf_quant_config": {**quant_config["hf_quant_config"], "producer": producer}}


def test_the_recorded_qwen3_moe_export_is_what_export_qat_weights_writes_today(megatron_cpu, cpu_backend):
    recorded = torch.load(RECORDING, weights_only=True)
    today = record(*trained_model())
    assert today["format"] == recorded["format"]
    assert today["hf_config"] == recorded["hf_config"]
    # The producer names the ModelOpt that wrote the file: the recording's, or this environment's.
    producer = today["quant_config"]["hf_quant_config"]["producer"]
    assert producer == {"name": "modelopt", "version": importlib.metadata.version("nvidia-modelopt")}
    assert today["quant_config"] == _with_producer(recorded["quant_config"], producer)
    for layout in LAYOUTS:
        _assert_same_stream(today["streams"][layout], recorded["streams"][layout])
    _assert_same_stream(today["trained"], recorded["trained"])
    # what the vLLM tests rely on: experts under per-expert names in one layout, fused in the other
    assert any(".experts.0.gate_proj.weight_scale" in name for name, _ in today["streams"]["per_expert"])
    assert any(name.endswith(".experts.w13_weight") for name, _ in today["streams"]["fused"])
    assert today["quant_config"]["quantization_config"]["ignore"] == ["lm_head", "model.layers.0.mlp.gate",
                                                                      "model.layers.1.mlp.gate"]
