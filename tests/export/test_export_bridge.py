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
def test_fused_layout_equals_bridge_native_export_name_for_name(qat_bridge_model):
    bridge, model = qat_bridge_model
    if not hasattr(bridge, "export_hf_weights_modelopt"):
        pytest.skip("this Megatron-Bridge has no export_hf_weights_modelopt (0.6+)")
    assert export_implementation(bridge) == "native"
    native = list(bridge.export_hf_weights_modelopt([model], quant_mode="w4a16_nvfp4", show_progress=False))
    ours = list(export_qat_weights([model], bridge, native=False, expert_layout="fused"))
    # native path, patchkit's checks first
    through_api = list(export_qat_weights([model], bridge, expert_layout="fused"))
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


# --- expert layouts -----------------------------------------------------------------------------

PER_EXPERT_SUFFIXES = {"weight", "weight_scale", "weight_scale_2"}


def _as_dict(stream) -> dict[str, torch.Tensor]:
    result = dict(stream)
    assert len(result) == len(stream), "a name came twice"
    return result


@pytest.mark.parametrize("qat_bridge_model", [True], ids=["moe"], indirect=True)
def test_per_expert_is_the_default_and_writes_modelopt_hf_expert_names(qat_bridge_model):
    bridge, model = qat_bridge_model
    default = list(export_qat_weights([model], bridge, native=False))
    names = [name for name, _ in default]
    assert names == [name for name, _ in export_qat_weights([model], bridge, native=False, expert_layout="per_expert")]
    assert not any(".experts.w13_" in n or ".experts.w2_" in n for n in names)
    layers, experts = model.config.num_layers, model.config.num_moe_experts
    for layer in range(layers):
        for expert in range(experts):
            for projection in ("gate_proj", "up_proj", "down_proj"):
                prefix = f"model.layers.{layer}.mlp.experts.{expert}.{projection}"
                found = {n[len(prefix) + 1:] for n in names if n.startswith(prefix + ".")}
                assert found == PER_EXPERT_SUFFIXES, prefix
    tensors = dict(default)
    gate = tensors["model.layers.0.mlp.experts.3.gate_proj.weight"]
    assert gate.dtype == torch.uint8 and gate.shape == (model.config.moe_ffn_hidden_size, model.config.hidden_size // 2)
    assert tensors["model.layers.0.mlp.experts.3.gate_proj.weight_scale"].dtype == torch.float8_e4m3fn
    # One Megatron linear_fc1 holds gate and up: one amax, one global scale for both.
    assert torch.equal(tensors["model.layers.0.mlp.experts.3.gate_proj.weight_scale_2"],
                       tensors["model.layers.0.mlp.experts.3.up_proj.weight_scale_2"])


def _assert_same_experts(per_expert: dict[str, torch.Tensor], fused: dict[str, torch.Tensor], experts: int) -> None:
    """Every fused tensor is its experts' per-expert tensors, byte for byte; nothing else differs."""
    plain = {n: t for n, t in fused.items() if ".experts.w13_" not in n and ".experts.w2_" not in n}
    assert set(plain) == {n for n in per_expert if ".mlp.experts." not in n}
    for name, tensor in plain.items():
        assert torch.equal(_bytes(tensor), _bytes(per_expert[name])), name
    fused_names = [n for n in fused if n not in plain]
    # 3 tensors per fused group, 2 groups per layer; per expert 3 tensors for each of 3 projections.
    assert len(fused_names) * experts * 3 // 2 == len(per_expert) - len(plain) > 0
    for name in fused_names:
        prefix, _, rest = name.partition(".experts.")
        group, _, kind = rest.partition("_")
        tensor = fused[name]
        assert tensor.shape[0] == experts, name
        for expert in range(experts):
            base = f"{prefix}.experts.{expert}"
            if group == "w2":
                assert torch.equal(_bytes(tensor[expert]), _bytes(per_expert[f"{base}.down_proj.{kind}"])), name
            elif kind in ("weight", "weight_scale"):
                stacked = torch.cat([per_expert[f"{base}.gate_proj.{kind}"], per_expert[f"{base}.up_proj.{kind}"]])
                assert torch.equal(_bytes(tensor[expert]), _bytes(stacked)), name
            else:
                pair = torch.stack([per_expert[f"{base}.gate_proj.{kind}"], per_expert[f"{base}.up_proj.{kind}"]])
                assert torch.equal(tensor[expert], pair), name


@pytest.mark.parametrize("qat_bridge_model", [True], ids=["moe"], indirect=True)
def test_per_expert_and_fused_layouts_hold_the_same_bytes(qat_bridge_model):
    bridge, model = qat_bridge_model
    per_expert = _as_dict(list(export_qat_weights([model], bridge, native=False, expert_layout="per_expert")))
    fused = _as_dict(list(export_qat_weights([model], bridge, native=False, expert_layout="fused")))
    _assert_same_experts(per_expert, fused, model.config.num_moe_experts)


@pytest.mark.parametrize("qat_bridge_model", [True], ids=["moe"], indirect=True)
def test_the_native_export_split_per_expert_equals_patchkits_per_expert_export(qat_bridge_model):
    bridge, model = qat_bridge_model
    if not hasattr(bridge, "export_hf_weights_modelopt"):
        pytest.skip("this Megatron-Bridge has no export_hf_weights_modelopt (0.6+)")
    ours = list(export_qat_weights([model], bridge, native=False))
    native = list(export_qat_weights([model], bridge))  # Bridge 0.6's own export, split per expert
    assert sorted(n for n, _ in native) == sorted(n for n, _ in ours)
    theirs = dict(native)
    for name, tensor in ours:
        assert tensor.dtype == theirs[name].dtype and tensor.shape == theirs[name].shape, name
        assert torch.equal(_bytes(tensor), _bytes(theirs[name])), name


@pytest.mark.parametrize("qat_bridge_model", [True], ids=["moe"], indirect=True)
@pytest.mark.parametrize("layout", ["perexpert", "FUSED", None, ""])
def test_an_unknown_expert_layout_is_refused_before_anything_is_exported(qat_bridge_model, layout):
    bridge, model = qat_bridge_model
    with pytest.raises(QATExportError, match="unknown expert_layout"):
        export_qat_weights([model], bridge, expert_layout=layout)
