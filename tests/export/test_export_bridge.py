"""Hugging Face names through Megatron-Bridge: patchkit's export equals Bridge 0.6's own, name for name.

Runs where Megatron-Bridge is installed (environment ``export-bridge-0.6``: Bridge 0.6.2, megatron-core
0.19.2, ModelOpt 0.47, Python 3.12). The model is a tiny Qwen3 (dense and MoE) built by the
Bridge's provider (``bridge_models``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

if importlib.util.find_spec("megatron.bridge") is None:
    pytest.skip("megatron-bridge is not installed", allow_module_level=True)

from bridge_models import build  # noqa: E402
from patchkit.patches.modelopt.qat import (  # noqa: E402
    QATExportError,
    apply_qat,
    export_implementation,
    export_qat_config,
    export_qat_weights,
)


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.uint8) if tensor.dtype == torch.float8_e4m3fn else tensor


@pytest.fixture
def qat_bridge_model(megatron_cpu, cpu_backend, request):
    bridge, model = build(request.param)
    (model,) = apply_qat([model])
    return bridge, model


@pytest.mark.parametrize("qat_bridge_model", [False, True], ids=["dense", "moe"], indirect=True)
def test_patchkit_export_equals_bridge_native_export_name_for_name(qat_bridge_model):
    bridge, model = qat_bridge_model
    if not hasattr(bridge, "export_hf_weights_modelopt"):
        pytest.skip("this Megatron-Bridge has no export_hf_weights_modelopt (0.6+)")
    assert export_implementation(bridge) == "native"
    native = list(bridge.export_hf_weights_modelopt([model], quant_mode="w4a16_nvfp4", show_progress=False))
    ours = list(export_qat_weights([model], bridge, native=False))
    through_api = list(export_qat_weights([model], bridge))  # native path, patchkit's checks first
    assert [n for n, _ in ours] == [n for n, _ in native] == [n for n, _ in through_api]
    for (name, mine), (_, theirs) in zip(ours, native, strict=True):
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        assert torch.equal(_bytes(mine), _bytes(theirs)), name
    assert any(t.dtype == torch.uint8 for _, t in ours)


@pytest.mark.parametrize("qat_bridge_model", [True], ids=["moe"], indirect=True)
def test_quant_config_uses_hf_names_and_excludes_lm_head_and_router(qat_bridge_model):
    bridge, model = qat_bridge_model
    quant = export_qat_config([model], bridge)["hf_quant_config"]["quantization"]
    assert quant["quant_algo"] == "W4A16_NVFP4"
    assert "lm_head" in quant["exclude_modules"]
    assert "model.layers.0.mlp.gate" in quant["exclude_modules"]
    assert not any("proj" in name for name in quant["exclude_modules"])


@pytest.mark.parametrize("qat_bridge_model", [False], ids=["dense"], indirect=True)
@pytest.mark.parametrize("native", [False, None])
def test_a_parameter_the_bridge_does_not_map_is_an_error_naming_it(qat_bridge_model, monkeypatch, native):
    bridge, model = qat_bridge_model
    registry_type = type(bridge._model_bridge.mapping_registry())
    lookup = registry_type.megatron_to_hf_lookup
    unknown = "decoder.layers.1.self_attention.linear_proj.weight"
    monkeypatch.setattr(registry_type, "megatron_to_hf_lookup",
                        lambda self, name: None if name == unknown else lookup(self, name))
    stream = export_qat_weights([model], bridge, native=native)
    with pytest.raises(QATExportError) as error:
        next(stream)
    assert error.value.parameter == unknown
    assert error.value.layer == "decoder.layers.1.self_attention.linear_proj"
