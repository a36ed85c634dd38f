"""The Megatron-Bridge export patches, exercised on Bridge's own classes and functions."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
from ep_worker import GROUPED_QUANTIZER
from megatron.bridge.models.conversion import model_bridge
from megatron.bridge.models.conversion.param_mapping import AutoMapping
from packaging.version import Version
from patchkit.patches.bridge.qat._checks.expert_sort_key import MIXED_NAMES, SORTED_NAMES
from patchkit.patches.modelopt.qat import apply_qat

import patchkit
from patchkit.runtime.errors import ForceRefusedError

BRIDGE = Version(importlib.metadata.version("megatron-bridge"))
EXPORT_PATCHES = (
    "bridge.quant_linear_parallelism", "bridge.skip_quantizer_params",
    "bridge.expert_local_to_global", "bridge.expert_sort_key",
)
#: Where upstream does the job itself (read from the wheels; each is shown below doing it).
NATIVE_FROM = {
    "bridge.quant_linear_parallelism": Version("0.4.0rc0"),
    "bridge.expert_local_to_global": Version("0.5.0rc0"),
    "bridge.expert_sort_key": Version("0.5.0rc0"),
}
APPLYING = tuple(p for p in EXPORT_PATCHES if BRIDGE < NATIVE_FROM.get(p, Version("999")))
NATIVE = tuple(p for p in EXPORT_PATCHES if p not in APPLYING)


def _expected_states() -> dict[str, str]:
    return {p: ("native" if p in NATIVE else "applied") for p in EXPORT_PATCHES}


def test_every_export_patch_applies_or_is_native_on_this_bridge():
    with patchkit.applied(*EXPORT_PATCHES) as records:
        assert {r.id: (r.reason or r.state).value for r in records} == _expected_states()
    assert {r.id: r.state.value for r in patchkit.status(*APPLYING)} == dict.fromkeys(APPLYING, "reverted")


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


def _parallelism(model) -> dict[str, str]:
    return {name: AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(model.get_submodule(name))
            for name in EXPECTED_PARALLELISM}


@pytest.mark.skipif(BRIDGE >= NATIVE_FROM["bridge.quant_linear_parallelism"], reason="native from Bridge 0.4")
def test_autodetects_parallelism_of_modelopt_quantized_linears(quantized_gpt):
    for name in EXPECTED_PARALLELISM:
        module = quantized_gpt.get_submodule(name)
        assert type(module).__name__.startswith("Quant")
        with pytest.raises(ValueError, match="Cannot determine parallelism type"):
            AutoMapping(f"{name}.weight", "hf.weight")._detect_parallelism_type(module)
    with patchkit.applied("bridge.quant_linear_parallelism"):
        found = _parallelism(quantized_gpt)
        assert "QuantColumnParallelLinear" in AutoMapping._MODULE_TYPE_REGISTRY["column"]
    assert found == EXPECTED_PARALLELISM
    assert "QuantColumnParallelLinear" not in AutoMapping._MODULE_TYPE_REGISTRY["column"]  # reverted


@pytest.mark.skipif(BRIDGE < NATIVE_FROM["bridge.quant_linear_parallelism"], reason="patched before Bridge 0.4")
def test_upstream_resolves_modelopt_quantized_linears_natively(quantized_gpt):
    """Bridge 0.4+: AutoMapping maps ModelOpt's dynamic Quant* classes to the class they wrap."""
    from megatron.bridge.models.conversion.utils import is_modelopt_dynamic_module

    assert all(is_modelopt_dynamic_module(quantized_gpt.get_submodule(name)) for name in EXPECTED_PARALLELISM)
    from patchkit.patches.bridge.qat import _quant_linear_parallelism

    with patchkit.applied("bridge.quant_linear_parallelism") as records:
        assert [(r.reason or r.state).value for r in records] == ["native"]
        assert _quant_linear_parallelism._added == []  # nothing of patchkit's in the registry
        assert _parallelism(quantized_gpt) == EXPECTED_PARALLELISM  # upstream alone: nothing was installed


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


@pytest.mark.skipif(BRIDGE < Version("0.4.0rc0"), reason="ENABLE_BRIDGE_QUANT_MAPPING exists from Bridge 0.4")
def test_quantizer_state_is_kept_when_bridge_exports_it_itself(quantized_gpt, monkeypatch):
    """With ENABLE_BRIDGE_QUANT_MAPPING=1 Bridge maps *_quantizer._amax itself: the patch drops nothing."""
    from megatron.bridge.models.conversion.mapping_registry import MegatronMappingRegistry

    upstream = _global_names(quantized_gpt)
    monkeypatch.setenv("ENABLE_BRIDGE_QUANT_MAPPING", "1")
    with patchkit.applied("bridge.skip_quantizer_params") as records:
        assert [r.state.value for r in records] == ["applied"]
        kept = _global_names(quantized_gpt)
        monkeypatch.setenv("ENABLE_BRIDGE_QUANT_MAPPING", "0")
        dropped = _global_names(quantized_gpt)
    assert kept == upstream and any(name.endswith("weight_quantizer._amax") for name in kept)
    assert dropped == [name for name in upstream if "_quantizer" not in name]
    # ...and Bridge's registry does map that state when the switch is on (what would be lost otherwise).
    monkeypatch.setenv("ENABLE_BRIDGE_QUANT_MAPPING", "1")
    registry = MegatronMappingRegistry(AutoMapping("decoder.layers.*.self_attention.linear_qkv.weight",
                                                   "model.layers.*.self_attn.qkv.weight"))
    amax = "decoder.layers.0.self_attention.linear_qkv.weight_quantizer._amax"
    assert registry.megatron_to_hf_lookup(amax) is not None


@pytest.mark.skipif(BRIDGE >= NATIVE_FROM["bridge.expert_sort_key"], reason="native from Bridge 0.5")
def test_sort_key_orders_both_expert_namings():
    upstream = sorted(MIXED_NAMES, key=model_bridge.extract_sort_key)
    assert upstream.index(MIXED_NAMES[0]) < upstream.index(MIXED_NAMES[1])  # local_experts.10 before .2 upstream
    with patchkit.applied("bridge.expert_sort_key"):
        patched = sorted(MIXED_NAMES, key=model_bridge.extract_sort_key)
    assert patched == SORTED_NAMES
    assert sorted(MIXED_NAMES, key=model_bridge.extract_sort_key) == upstream  # reverted


@pytest.mark.skipif(BRIDGE < NATIVE_FROM["bridge.expert_sort_key"], reason="patched before Bridge 0.5")
def test_upstream_sort_key_orders_both_expert_namings_natively():
    with patchkit.applied("bridge.expert_sort_key") as records:
        assert [(r.reason or r.state).value for r in records] == ["native"]
        assert sorted(MIXED_NAMES, key=model_bridge.extract_sort_key) == SORTED_NAMES


@pytest.fixture(scope="module")
def ep_results(tmp_path_factory):
    """Each of 4 gloo ranks (EP=4, 8 experts) runs ``ep_worker.run``; their JSON results, by rank."""
    import ep_worker
    from _multiprocess import rendezvous, spawn_ranks

    out = tmp_path_factory.mktemp("ep")
    # spawn: fresh interpreters that load ModelOpt's plugin and Bridge in ep_worker.load_upstreams (forking
    # the pytest process, with gloo and torch threads used, is unsafe; see ep_worker for the forkserver).
    spawn_ranks(ep_worker.run, 4, (4, str(out), rendezvous(out / "rendezvous")), timeout=600)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(4)]


SEQUENTIAL_0 = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"
SEQUENTIAL_1 = "decoder.layers.1.mlp.experts.local_experts.1.linear_fc2.weight"
GROUPED_0 = "decoder.layers.0.mlp.experts.linear_fc1.weight0"
GROUPED_1 = "decoder.layers.1.mlp.experts.linear_fc2.weight1"
UNCHANGED = ("decoder.layers.0.self_attention.linear_qkv.weight", "decoder.layers.0.mlp.router.weight")
#: A SequentialMLP expert's own quantizer state: exported by Bridge 0.4+ with ENABLE_BRIDGE_QUANT_MAPPING=1,
#: so numbered globally like its weight (by the patch on 0.2-0.4, by upstream from 0.5).
SEQUENTIAL_QUANTIZER = "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight_quantizer._amax"


def _numbered_quantizer(expert: int) -> str:
    """``SEQUENTIAL_QUANTIZER`` with its expert numbered ``expert`` (Bridge 0.5+'s own naming)."""
    return SEQUENTIAL_QUANTIZER.replace(".local_experts.1.", f".local_experts.{expert}.")


def _global_names_of(first: int, second: int) -> dict[str, str]:
    return {
        SEQUENTIAL_0: f"decoder.layers.0.mlp.experts.local_experts.{first}.linear_fc1.weight",
        SEQUENTIAL_1: f"decoder.layers.1.mlp.experts.local_experts.{second}.linear_fc2.weight",
        GROUPED_0: f"decoder.layers.0.mlp.experts.linear_fc1.weight{first}",
        GROUPED_1: f"decoder.layers.1.mlp.experts.linear_fc2.weight{second}",
        SEQUENTIAL_QUANTIZER: _numbered_quantizer(second),
    } | {name: name for name in UNCHANGED}


@pytest.mark.slow
@pytest.mark.skipif(BRIDGE >= NATIVE_FROM["bridge.expert_local_to_global"], reason="native from Bridge 0.5")
def test_expert_names_map_local_to_global_on_ep_ranks_0_to_3(ep_results):
    for rank, result in enumerate(ep_results):
        assert result["ep_rank"] == rank and result["states"] == ["applied"]
        patched, upstream = result["patched"], result["upstream"]
        expected = _global_names_of(2 * rank, 2 * rank + 1)  # 8 experts, 2 per EP rank
        assert {name: patched[name] for name in expected} == expected
        assert patched[GROUPED_QUANTIZER] == GROUPED_QUANTIZER
        # What upstream does alone: grouped names mapped, SequentialMLP names left local,
        # a grouped quantizer name breaks its expert-number parsing.
        assert upstream[GROUPED_0] == patched[GROUPED_0]
        assert upstream[SEQUENTIAL_0] == SEQUENTIAL_0
        assert upstream[SEQUENTIAL_QUANTIZER] == SEQUENTIAL_QUANTIZER  # rank 0's name on every rank
        assert upstream[GROUPED_QUANTIZER].startswith("ValueError")


@pytest.mark.slow
@pytest.mark.skipif(not (Version("0.4.0rc0") <= BRIDGE < NATIVE_FROM["bridge.expert_local_to_global"]),
                    reason="ENABLE_BRIDGE_QUANT_MAPPING from Bridge 0.4; native renumbering from 0.5")
def test_exported_expert_quantizer_state_gets_the_global_hf_expert_number(ep_results, monkeypatch):
    """Bridge 0.4 with ENABLE_BRIDGE_QUANT_MAPPING=1 exports a SequentialMLP expert's amax under the HF name
    its registry derives from the global Megatron name: on EP rank r (2 experts each) local expert 1 is
    HF expert 2r+1, as its weight is. Before the fix every rank exported it as HF expert 1."""
    from megatron.bridge.models.qwen.qwen3_moe_bridge import Qwen3MoEBridge

    monkeypatch.setenv("ENABLE_BRIDGE_QUANT_MAPPING", "1")
    registry = Qwen3MoEBridge().mapping_registry()
    for rank, result in enumerate(ep_results):
        amax = registry.megatron_to_hf_lookup(result["patched"][SEQUENTIAL_QUANTIZER])
        owner_weight = result["patched"][SEQUENTIAL_QUANTIZER].replace(".weight_quantizer._amax", ".weight")
        weight = registry.megatron_to_hf_lookup(owner_weight)
        assert amax is not None and weight is not None
        hf_names = getattr(amax, "hf_targets", [amax.hf_param])  # 0.4: one amax fanned out to gate and up
        assert f"model.layers.0.mlp.experts.{2 * rank + 1}.gate_proj.weight_quantizer._amax" in hf_names, hf_names
        assert weight.hf_param["gate"] == f"model.layers.0.mlp.experts.{2 * rank + 1}.gate_proj.weight"


@pytest.mark.slow
@pytest.mark.skipif(not (Version("0.4.2rc0") <= BRIDGE < Version("0.5.0rc0")), reason="Bridge 0.4.2's _get_ep_group")
def test_expert_names_use_the_ep_group_of_the_model_as_upstream_does(ep_results):
    """A model with its own EP group of 2 ranks: both namings numbered within that group, as upstream's."""
    for rank, result in enumerate(ep_results):
        local_rank = rank % 2  # groups {0, 1} and {2, 3}: 4 experts per rank
        expected = _global_names_of(4 * local_rank, 4 * local_rank + 1)
        assert {name: result["model_group"][name] for name in expected} == expected
        assert result["model_group_upstream"][GROUPED_0] == expected[GROUPED_0]  # upstream's own grouped naming
        assert result["model_group_upstream"][SEQUENTIAL_0] == SEQUENTIAL_0  # upstream leaves SequentialMLP local


@pytest.mark.slow
@pytest.mark.skipif(BRIDGE < NATIVE_FROM["bridge.expert_local_to_global"], reason="patched before Bridge 0.5")
def test_upstream_maps_expert_names_natively_with_the_same_names(ep_results):
    """0.5+: upstream alone gives the names the patch gives on 0.2-0.4, a SequentialMLP expert's quantizer
    state included; the wrap on top would renumber twice. The grouped experts' shared quantizer stays
    unnumbered."""
    for rank, result in enumerate(ep_results):
        assert result["states"] == ["native"]
        expected = _global_names_of(2 * rank, 2 * rank + 1)
        assert {name: result["upstream"][name] for name in expected} == expected
        assert result["patched"] == result["upstream"]  # nothing was installed
        assert result["upstream"][GROUPED_QUANTIZER] == GROUPED_QUANTIZER  # quantizer state left alone too
        # The wrap renumbers upstream's global numbers again: + 2 * rank (rank 3: 12, 13, not 6, 7).
        twice = result["wrapped_over_upstream"]
        assert twice[SEQUENTIAL_0] == _global_names_of(4 * rank, 4 * rank + 1)[SEQUENTIAL_0]
        assert twice[SEQUENTIAL_1] == _global_names_of(4 * rank, 4 * rank + 1)[SEQUENTIAL_1]
        if "_get_ep_group" in dir(model_bridge):
            in_group = _global_names_of(4 * (rank % 2), 4 * (rank % 2) + 1)
            assert {name: result["model_group_upstream"][name] for name in expected} == in_group


@pytest.mark.slow
@pytest.mark.skipif(BRIDGE < NATIVE_FROM["bridge.expert_local_to_global"], reason="patched before Bridge 0.5")
def test_forcing_the_expert_name_patch_where_upstream_is_native_is_refused(ep_results):
    """PATCHKIT_FORCE on 0.5+ would renumber twice: strict mode raises, non-strict skips as native, error kept."""
    for result in ep_results:
        forced = result["forced"]
        ((state, reason, error),) = forced["states"]
        assert (state, reason) == ("skipped", "native"), forced
        assert error and "PATCHKIT_FORCE refused" in error and "natively" in error
        assert forced["strict"]["error"] == ForceRefusedError.__name__ and forced["strict"]["refused"], forced
        assert "bridge.expert_local_to_global" in forced["strict"]["message"]
        assert "natively" in forced["strict"]["message"]
        assert forced["names"] == result["upstream"]  # nothing was installed: upstream's names, not renumbered twice


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
    expected = {p: (["skipped", "native"] if p in NATIVE else ["applied", None]) for p in EXPORT_PATCHES}
    native = BRIDGE < Version("0.3.0rc0")
    expected["bridge.modelopt_layer_spec"] = ["skipped", "native"] if native else ["applied", None]
    # Its module (training/utils/sig_utils) is not imported here: it waits for it, or is native from 0.6.
    expected["bridge.signal_handler_main_thread"] = (
        ["skipped", "native"] if BRIDGE >= Version("0.6.0") else ["pending", None])
    # Bridge 0.3 gets the method; 0.4+ has it; 0.2 has no adapter export to build it on.
    expected["bridge.save_hf_adapter"] = (
        ["skipped", "unsupported_version"] if BRIDGE < Version("0.3.0rc0")
        else ["applied", None] if BRIDGE < Version("0.4.0rc0") else ["skipped", "native"])
    # Its module (training/utils/train_utils) is not imported here either; Bridge has the helpers from 0.5.
    expected["bridge.value_model_helpers"] = (
        ["skipped", "native"] if BRIDGE >= Version("0.5.0rc0") else ["pending", None])
    assert states == expected
