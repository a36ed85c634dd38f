"""The QAT config builder against the installed ModelOpt (dict era before 0.44, list era after)."""

from __future__ import annotations

import importlib.metadata

import modelopt.torch.quantization as mtq
import pytest
from modelopt.torch.quantization import config as mtq_config
from packaging.version import Version
from patchkit.patches.modelopt.qat import QATConfigError, build_qat_config, hf_patterns_to_megatron

MODELOPT = Version(importlib.metadata.version("nvidia-modelopt"))
LIST_ERA = MODELOPT >= Version("0.44")
NVFP4_WEIGHT = {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)}}


def _entries(quant_cfg):
    """(pattern, attributes) pairs in application order, for either shape."""
    if isinstance(quant_cfg, list):
        return [(e["quantizer_name"], {**e.get("cfg", {}), **({"enable": e["enable"]} if "enable" in e else {})})
                for e in quant_cfg if "parent_class" not in e]
    return [(k, v) for k, v in quant_cfg.items() if isinstance(v, dict) and not k.startswith("nn.")]


def test_config_has_the_shape_the_installed_modelopt_reads():
    config = build_qat_config("w4a16_nvfp4", backend=None)
    assert isinstance(config["quant_cfg"], list if LIST_ERA else dict)
    if LIST_ERA:
        assert mtq_config.normalize_quant_cfg_list(config["quant_cfg"])  # upstream's own parser accepts it
    mtq_config.QuantizeConfig.model_validate(config)


@pytest.mark.skipif(not hasattr(mtq, "W4A16_NVFP4_CFG"), reason="W4A16_NVFP4_CFG exists from ModelOpt 0.45")
def test_builds_on_modelopts_w4a16_preset_where_it_exists():
    config = build_qat_config(backend=None)
    preset = mtq.W4A16_NVFP4_CFG["quant_cfg"]
    assert config["quant_cfg"][: len(preset)] == list(preset)


def test_weights_nvfp4_blocks_of_16_and_activations_untouched():
    entries = _entries(build_qat_config(backend=None)["quant_cfg"])
    weight = [attrs for pattern, attrs in entries if pattern == "*weight_quantizer"]
    assert len(weight) == 1 and {k: weight[0][k] for k in NVFP4_WEIGHT} == NVFP4_WEIGHT
    assert weight[0].get("enable", True) is True
    # Everything else, input quantizers included, starts disabled.
    off_first = entries[0] if LIST_ERA else ("default", build_qat_config(backend=None)["quant_cfg"]["default"])
    assert off_first[0] in ("*", "default") and off_first[1] == {"enable": False}
    assert not any("input_quantizer" in p and a.get("enable", True) for p, a in entries)


def test_modelopts_default_disabled_list_is_merged_in_either_shape():
    quant_cfg = build_qat_config(backend=None)["quant_cfg"]
    defaults = mtq_config._default_disabled_quantizer_cfg
    if LIST_ERA:
        for entry in defaults:
            assert entry in quant_cfg
    else:
        for key, value in defaults.items():
            assert quant_cfg[key] == value
    patterns = [p for p, _ in _entries(quant_cfg)]
    assert "*output_layer*" in patterns and "*router*" in patterns


def test_hf_ignore_patterns_become_megatron_patterns_and_come_last():
    mapping = hf_patterns_to_megatron(["lm_head", "*mlp.gate", "*self_attn*", "*mlp.gate_proj", "model.layers.3.*"])
    assert mapping == {
        "lm_head": "output_layer.*",
        "*mlp.gate": "*mlp.router.*",
        "*self_attn*": "*self_attention*",
        "*mlp.gate_proj": "*mlp.linear_fc1.*",
        "model.layers.3.*": "decoder.layers.3.*",
    }
    entries = _entries(build_qat_config(ignore=list(mapping), backend=None)["quant_cfg"])
    assert [p for p, _ in entries[-len(mapping):]] == list(mapping.values())
    assert all(a == {"enable": False} for _, a in entries[-len(mapping):])


def test_mtp_disabled_unless_asked():
    patterns = [p for p, a in _entries(build_qat_config(backend=None)["quant_cfg"]) if a == {"enable": False}]
    assert "*mtp.*" in patterns
    patterns = [p for p, a in _entries(build_qat_config(quantize_mtp=True, backend=None)["quant_cfg"])
                if a == {"enable": False}]
    assert not any("mtp" in p for p in patterns)


def test_unsupported_mode_names_what_exists():
    with pytest.raises(QATConfigError, match=r"unsupported QAT mode: 'w8a8_int8'; supported: w4a16_nvfp4"):
        build_qat_config("w8a8_int8")


def test_unregistered_backend_is_refused():
    with pytest.raises(QATConfigError, match="not registered"):
        build_qat_config(backend="no_such_backend")


def test_cpu_backend_selected_only_while_its_patch_is_applied(cpu_backend):
    entries = _entries(build_qat_config()["quant_cfg"])
    assert dict(entries)["*weight_quantizer"]["backend"] == "patchkit_nvfp4_cpu"


def test_without_the_patch_modelopts_kernel_is_used():
    entries = _entries(build_qat_config()["quant_cfg"])
    assert "backend" not in dict(entries)["*weight_quantizer"]


@pytest.mark.parametrize("alias", ["w4a16", "W4A16", "W4A16_NVFP4_CFG", "nvfp4-w4a16", " w4a16_nvfp4 "])
def test_framework_and_modelopt_mode_names_are_aliases(alias):
    assert build_qat_config(alias, backend=None) == build_qat_config("w4a16_nvfp4", backend=None)


def test_unknown_mode_lists_the_modes_and_aliases():
    with pytest.raises(QATConfigError, match=r"'w4a4'; supported: w4a16_nvfp4, w4a16, nvfp4_w4a16, W4A16_NVFP4_CFG"):
        build_qat_config("w4a4")
    with pytest.raises(QATConfigError, match="unsupported QAT mode: 'None'"):
        build_qat_config(None)


def test_verl_keyword_and_forms_give_the_same_config():
    verl = build_qat_config("w4a16", ignore_patterns=["*output_layer*", "*router*"], backend=None)
    ours = build_qat_config("w4a16_nvfp4", ["*output_layer*", "*router*"], backend=None)
    assert verl == ours
    assert build_qat_config("w4a16", ignore_patterns=None, backend=None) == build_qat_config(backend=None)
    with pytest.raises(TypeError, match="not both"):
        build_qat_config(ignore=["a"], ignore_patterns=["b"])


def test_hf_megatron_and_verl_ignore_forms_map_as_documented():
    assert hf_patterns_to_megatron(["*output_layer*", "*router*", "lm_head", "*mlp.gate", "*mlp.gate.",
                                    "decoder.layers.0.mlp", "output_layer"]) == {
        "*output_layer*": "*output_layer*",
        "*router*": "*router*",
        "lm_head": "output_layer.*",
        "*mlp.gate": "*mlp.router.*",
        "*mlp.gate.": "*mlp.router.*",
        "decoder.layers.0.mlp": "decoder.layers.0.mlp.*",
        "output_layer": "output_layer.*",
    }
