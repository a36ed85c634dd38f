"""The Megatron-Bridge export patches, exercised on Bridge's own classes and functions."""

from __future__ import annotations

import importlib.metadata
import json
import socket

import pytest
import torch
from ep_worker import GROUPED_QUANTIZER
from megatron.bridge.models.conversion import model_bridge
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from packaging.version import Version
from patchkit.patches.modelopt.qat import apply_qat

import patchkit

BRIDGE = Version(importlib.metadata.version("megatron-bridge"))
EXPORT_PATCHES = (
    "bridge.quant_linear_parallelism", "bridge.skip_quantizer_params",
    "bridge.expert_local_to_global", "bridge.expert_sort_key",
)


def test_every_export_patch_applies_on_this_bridge():
    with patchkit.applied(*EXPORT_PATCHES) as records:
        assert {r.id: r.state.value for r in records} == dict.fromkeys(EXPORT_PATCHES, "applied")
    assert {r.id: r.state.value for r in patchkit.status(*EXPORT_PATCHES)} == dict.fromkeys(EXPORT_PATCHES, "reverted")


@pytest.fixture
def quantized_gpt(tiny_moe_gpt, cpu_backend):
    model = tiny_moe_gpt()
    apply_qat(model)
    return model


EXPECTED_PARALLELISM = {
    "decoder.layers.0.self_attention.linear_qkv": "column",
    "decoder.layers.0.self_attention.linear_proj": "row",
    "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1": "column",
    "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2": "row",
    "output_layer": "column",
}


def test_autodetects_parallelism_of_modelopt_quantized_linears(quantized_gpt):
    for name in EXPECTED_PARALLELISM:
        module = quantized_gpt.get_submodule(name)
        assert type(module).__name__.startswith("Quant")
        with pytest.raises(ValueError, match="Cannot determine parallelism type"):
            AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(module)
    with patchkit.applied("bridge.quant_linear_parallelism"):
        found = {
            name: AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(quantized_gpt.get_submodule(name))
            for name in EXPECTED_PARALLELISM
        }
        assert "QuantColumnParallelLinear" in AutoMapping._MODULE_TYPE_REGISTRY["column"]
    assert found == EXPECTED_PARALLELISM
    assert "QuantColumnParallelLinear" not in AutoMapping._MODULE_TYPE_REGISTRY["column"]  # reverted


def _global_names(model) -> list[str]:
    from megatron.bridge.models.qwen.qwen3_moe_bridge import Qwen3MoEBridge

    return Qwen3MoEBridge()._megatron_global_param_names_all_pp_ranks([model])


def test_quantizer_state_is_not_exported(quantized_gpt):
    upstream = _global_names(quantized_gpt)
    assert any(name.endswith("weight_quantizer._amax") for name in upstream)
    with patchkit.applied("bridge.skip_quantizer_params"):
        patched = _global_names(quantized_gpt)
    assert not any("_quantizer" in name for name in patched)
    assert patched == [name for name in upstream if "_quantizer" not in name]
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in patched


MIXED = [
    "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
    "decoder.layers.0.mlp.experts.linear_fc1.weight11",
    "decoder.layers.0.mlp.experts.linear_fc1.weight3",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "embedding.word_embeddings.weight",
]


def test_sort_key_orders_both_expert_namings():
    upstream = sorted(MIXED, key=model_bridge.extract_sort_key)
    assert upstream.index(MIXED[0]) < upstream.index(MIXED[1])  # local_experts.10 before .2 upstream
    with patchkit.applied("bridge.expert_sort_key"):
        patched = sorted(MIXED, key=model_bridge.extract_sort_key)
    assert patched == [
        "embedding.word_embeddings.weight",
        "decoder.layers.0.self_attention.linear_qkv.weight",
        "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight",
        "decoder.layers.0.mlp.experts.linear_fc1.weight3",
        "decoder.layers.0.mlp.experts.local_experts.10.linear_fc1.weight",
        "decoder.layers.0.mlp.experts.linear_fc1.weight11",
        "decoder.layers.1.self_attention.linear_qkv.weight",
    ]
    assert sorted(MIXED, key=model_bridge.extract_sort_key) == upstream  # reverted


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_expert_names_map_local_to_global_on_ep_ranks_0_to_3(tmp_path):
    import multiprocessing

    import ep_worker

    multiprocessing.get_context("forkserver").set_forkserver_preload(["ep_preload"])
    torch.multiprocessing.start_processes(
        ep_worker.run, args=(4, _free_port(), str(tmp_path)), nprocs=4, join=True, start_method="forkserver"
    )
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(4)]
    for rank, result in enumerate(results):
        assert result["ep_rank"] == rank and result["states"] == ["applied"]
        first, second = 2 * rank, 2 * rank + 1  # 8 experts, 2 per EP rank
        patched, upstream = result["patched"], result["upstream"]
        assert patched["decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"] == (
            f"decoder.layers.0.mlp.experts.local_experts.{first}.linear_fc1.weight")
        assert patched["decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"] == (
            f"decoder.layers.1.mlp.experts.local_experts.{second}.linear_fc2.weight")
        assert patched["decoder.layers.0.mlp.experts.linear_fc1.weight0"] == (
            f"decoder.layers.0.mlp.experts.linear_fc1.weight{first}")
        assert patched["decoder.layers.1.mlp.experts.linear_fc2.weight1"] == (
            f"decoder.layers.1.mlp.experts.linear_fc2.weight{second}")
        for unchanged in ("decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.0.mlp.router.weight",
                          "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight_quantizer._amax",
                          GROUPED_QUANTIZER):
            assert patched[unchanged] == unchanged
        # What upstream does alone: grouped names mapped, SequentialMLP names left local,
        # a grouped quantizer name breaks its expert-number parsing.
        grouped = "decoder.layers.0.mlp.experts.linear_fc1.weight0"
        sequential = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"
        assert upstream[grouped] == patched[grouped]
        assert upstream[sequential] == sequential
        assert upstream[GROUPED_QUANTIZER].startswith("ValueError")


_STARTUP = """
import json, sys
import patchkit
patchkit.apply_all()                                   # before any upstream import, as trainers do
from te_stub import bridge_import_context
from te_harness import load_modelopt_megatron_plugin
load_modelopt_megatron_plugin()
with bridge_import_context():
    import megatron.bridge.models.conversion.model_bridge
    import megatron.bridge.models.gpt_provider
json.dump({r.id: [r.state.value, r.reason and r.reason.value] for r in patchkit.status("bridge.*")}, sys.stdout)
"""


@pytest.mark.slow
def test_patches_declared_at_startup_install_when_bridge_is_imported(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _STARTUP], cwd=Path(__file__).parent, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    states = json.loads(done.stdout.strip().splitlines()[-1])
    expected = dict.fromkeys(EXPORT_PATCHES, ["applied", None])
    native = BRIDGE < Version("0.3.0rc0")
    expected["bridge.modelopt_layer_spec"] = ["skipped", "native"] if native else ["applied", None]
    assert states == expected
