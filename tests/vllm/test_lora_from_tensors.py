"""``vllm.lora_from_tensors``: a LoRA adapter handed to vLLM's worker LoRA manager as tensors + PEFT config.

Upstream truth: the same adapter written as a PEFT folder and loaded by vLLM's own ``_load_adapter``
(``LoRAModel.from_local_checkpoint``). Through the patch, the ``LoRAModel`` from tensors must equal it bit
for bit (every ``lora_a``/``lora_b`` with dtype and shape, rank, scaling, alpha, modules), and once added,
the LoRA layers' slots must hold the same values. Bad input is refused with ``LoRATensorsError`` naming
the tensor, and the manager's adapters stay as they were. Without the patch, vLLM (0.24, 0.29, 0.33)
finds no adapter: the test pinning that fails on the release that loads tensors itself (declare it native).

The manager is vLLM's ``LRUCacheWorkerLoRAManager`` over a tiny model of vLLM's linear layers
(``patchkit.patches.vllm.lora._checks._tiny_lora``, shared with the self-check).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from patchkit.patches.vllm._checks._cpu_stand_in import vllm_context
from patchkit.patches.vllm.lora import (
    LoRAFromTensorsUnavailableError,
    LoRATensorsError,
    TensorLoRARequest,
    add_lora_from_tensors,
)
from patchkit.patches.vllm.lora._checks._tiny_lora import (
    LAYER,
    LORA_DTYPE,
    MAX_RANK,
    PEFT_PREFIX,
    RANK,
    adapter_tensors,
    differences,
    peft_config,
    peft_folder,
    unpinned_without_cuda,
    worker_lora_manager,
)
from vllm_fixtures import installed

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

pytestmark = pytest.mark.usefixtures("patches_restored")

PATCH = "vllm.lora_from_tensors"
Q_A = f"{PEFT_PREFIX}{LAYER}.self_attn.q_proj.lora_A.weight"
Q_B = f"{PEFT_PREFIX}{LAYER}.self_attn.q_proj.lora_B.weight"
DOWN_A = f"{PEFT_PREFIX}{LAYER}.mlp.down_proj.lora_A.weight"
DOWN_B = f"{PEFT_PREFIX}{LAYER}.mlp.down_proj.lora_B.weight"


@pytest.fixture
def applied() -> Iterator[None]:
    with installed(PATCH):
        yield


@pytest.fixture
def manager(vllm_config: object) -> Iterator[Any]:
    with vllm_context("cpu"), unpinned_without_cuda():
        yield worker_lora_manager()


def from_folder(manager: Any, config: dict[str, Any], tensors: dict[str, torch.Tensor], lora_id: int = 1) -> Any:
    """vLLM's own load of the adapter, from the PEFT folder it was written to."""
    from vllm.lora.request import LoRARequest

    with peft_folder(config, tensors) as folder:
        return manager._load_adapter(LoRARequest(f"folder-{lora_id}", lora_id, str(folder)))


def from_tensors(manager: Any, config: dict[str, Any], tensors: dict[str, torch.Tensor], lora_id: int = 1) -> Any:
    return manager._load_adapter(TensorLoRARequest(f"tensors-{lora_id}", lora_id, peft_config=config,
                                                   lora_tensors=tensors))


# --- upstream pinned ---


def test_vllm_alone_loads_no_adapter_from_tensors(manager):
    """Without the patch the request is a folder name vLLM cannot find, and nothing is loaded. When a
    release loads adapters from tensors itself, this fails there: declare that range native."""
    from vllm.exceptions import LoRAAdapterNotFoundError

    request = TensorLoRARequest("policy", 1, peft_config=peft_config(), lora_tensors=adapter_tensors(seed=1))
    # vLLM's own code, whatever an earlier test of the session left applied (doctor applies every patch)
    installed = {status.id for status in patchkit.status() if status.state.installed}
    with upstream_behaviour(PATCH) if PATCH in installed else contextlib.nullcontext():
        with pytest.raises(LoRAAdapterNotFoundError):
            manager.add_adapter(request)
    assert manager.list_adapters() == set()


# --- the LoRAModel equals vLLM's load from the folder ---


@pytest.mark.parametrize(("overrides", "dtype"), [
    ({}, torch.float32),
    ({}, torch.bfloat16),
    ({"use_rslora": True, "lora_alpha": 16}, torch.float32),
    ({"lora_alpha": 3}, torch.float16),
], ids=["fp32", "bf16", "rslora", "fp16-alpha3"])
def test_adapter_from_tensors_equals_vllms_load_of_the_peft_folder(applied, manager, overrides, dtype):
    config, tensors = peft_config(**overrides), adapter_tensors(seed=2, dtype=dtype)
    ours, theirs = from_tensors(manager, config, tensors), from_folder(manager, config, tensors)
    assert differences(ours, theirs) == []
    assert len(ours.loras) == 7 and ours.rank == RANK
    assert all(weights.lora_a.dtype == torch.bfloat16 for weights in ours.loras.values())  # lora_dtype


def test_added_adapter_fills_the_layers_slots_as_the_folders_does(applied, manager):
    """Both adapters added and activated: every LoRA layer's slot of one equals the other's (after vLLM
    packs q/k/v and gate/up and folds the scaling in)."""
    from vllm.lora.request import LoRARequest

    config, tensors = peft_config(lora_alpha=16), adapter_tensors(seed=4)
    with peft_folder(config, tensors) as folder:
        assert manager.add_adapter(LoRARequest("folder", 1, str(folder)))
    assert add_lora_from_tensors(manager, "tensors", 2, tensors, config)
    assert manager.list_adapters() == {1, 2}
    slots = manager._adapter_manager.lora_index_to_id
    folder_slot, tensor_slot = slots.index(1), slots.index(2)
    compared = 0
    for name, layer in manager._adapter_manager.modules.items():
        for stacked in ("lora_a_stacked", "lora_b_stacked"):
            for index, buffer in enumerate(getattr(layer, stacked)):
                assert torch.equal(buffer[tensor_slot], buffer[folder_slot]), (name, stacked, index)
                assert buffer[tensor_slot].abs().sum() > 0, (name, stacked, index)
                compared += 1
    assert compared == 2 * (3 + 1 + 2 + 1)  # qkv (3 slices), o, gate_up (2), down


def test_callers_tensors_are_left_as_they_were(applied, manager):
    """vLLM folds the scaling into lora_b in place as it adds an adapter: on a copy, not on the caller's."""
    config, tensors = peft_config(lora_alpha=16), adapter_tensors(seed=5, dtype=LORA_DTYPE)  # .to() keeps them
    before = {name: tensor.clone() for name, tensor in tensors.items()}
    add_lora_from_tensors(manager, "policy", 1, tensors, config)
    add_lora_from_tensors(manager, "policy", 1, tensors, config)  # in place, from the same tensors
    assert all(torch.equal(tensors[name], before[name]) for name in tensors)


def test_load_inplace_replaces_the_adapter_under_its_id(applied, manager):
    """The second adapter under id 1 is served as vLLM serves it from its folder (a fresh manager's add)."""
    from vllm.lora.request import LoRARequest

    config = peft_config()
    add_lora_from_tensors(manager, "policy", 1, adapter_tensors(seed=6), config)
    add_lora_from_tensors(manager, "policy", 1, adapter_tensors(seed=7), config)
    reference = worker_lora_manager()
    with peft_folder(config, adapter_tensors(seed=7)) as folder:
        reference.add_adapter(LoRARequest("folder", 1, str(folder)))
    assert differences(manager._adapter_manager.get_adapter(1), reference._adapter_manager.get_adapter(1)) == []


def test_a_tensor_on_another_device_or_non_contiguous_loads_the_same(applied, manager):
    config, tensors = peft_config(), adapter_tensors(seed=8)
    transposed = {name: tensor.t().contiguous().t() for name, tensor in tensors.items()}  # column-major views
    assert not transposed[Q_A].is_contiguous()
    assert differences(from_tensors(manager, config, transposed), from_folder(manager, config, tensors)) == []


# --- bad input: a typed error naming the tensor, nothing loaded ---


def _drop(name: str):
    return lambda tensors: {k: v for k, v in tensors.items() if k != name}


def _replace(name: str, make):
    return lambda tensors: {**tensors, name: make(tensors[name])}


def _add(name: str, tensor: torch.Tensor):
    return lambda tensors: {**tensors, name: tensor}


BAD_INPUT = {
    "missing lora_B": (_drop(Q_B), Q_B),
    "missing lora_A": (_drop(DOWN_A), DOWN_A),
    "lora_B one row short": (_replace(Q_B, lambda t: t[:-1]), Q_B),
    "lora_A wrong input size": (_replace(DOWN_A, lambda t: torch.cat([t, t], dim=1)), DOWN_A),
    "rank 3 where the config says 4": (_replace(DOWN_A, lambda t: t[:-1]), DOWN_A),
    "lora_B of another rank": (_replace(Q_B, lambda t: t[:, :-1]), Q_B),
    "unsupported target": (_add(f"{PEFT_PREFIX}{LAYER}.mlp.act_fn.lora_A.weight", torch.zeros(RANK, 8)),
                           f"{PEFT_PREFIX}{LAYER}.mlp.act_fn.lora_A.weight"),
    "module the model lacks": (lambda tensors: {**tensors, **{k.replace("layers.0", "layers.5"): v
                                                             for k, v in tensors.items() if "down_proj" in k}},
                               DOWN_A.replace("layers.0", "layers.5")),
    "not a LoRA name": (_add(f"{PEFT_PREFIX}{LAYER}.mlp.down_proj.weight", torch.zeros(64, 96)),
                        f"{PEFT_PREFIX}{LAYER}.mlp.down_proj.weight"),
    "not a tensor": (_replace(Q_A, lambda t: t.tolist()), Q_A),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_tensors_are_refused_by_name_and_the_adapter_in_place_stays(applied, manager, case):
    change, named = BAD_INPUT[case]
    config, good = peft_config(), adapter_tensors(seed=9)
    add_lora_from_tensors(manager, "policy", 1, good, config)
    served = {name: tensor.clone() for name, tensor in _layer_slots(manager).items()}
    with pytest.raises(LoRATensorsError) as refused:
        add_lora_from_tensors(manager, "policy", 1, change(adapter_tensors(seed=10)), config)  # load_inplace
    assert refused.value.tensor == named, str(refused.value)
    assert repr(named) in str(refused.value)
    with pytest.raises(LoRATensorsError):
        add_lora_from_tensors(manager, "other", 2, change(adapter_tensors(seed=10)), config)
    assert manager.list_adapters() == {1}
    assert all(torch.equal(tensor, served[name]) for name, tensor in _layer_slots(manager).items())


@pytest.mark.parametrize(("overrides", "found"), [
    ({"r": MAX_RANK * 2}, "greater than max_lora_rank"),
    ({"use_dora": True}, "DoRA"),
    ({"r": None}, ""),
], ids=["rank-over-max", "dora", "no-rank"])
def test_a_peft_config_vllm_refuses_raises_before_any_tensor_is_read(applied, manager, overrides, found):
    config = peft_config(**overrides)
    if overrides.get("r") is None and "r" in overrides:
        del config["r"]
    with pytest.raises(LoRATensorsError) as refused:
        add_lora_from_tensors(manager, "policy", 1, adapter_tensors(seed=1), config)
    assert refused.value.tensor is None and found in str(refused.value)
    assert manager.list_adapters() == set()


def _layer_slots(manager: Any) -> dict[str, torch.Tensor]:
    return {f"{name}.{stacked}.{index}": buffer for name, layer in manager._adapter_manager.modules.items()
            for stacked in ("lora_a_stacked", "lora_b_stacked") for index, buffer in enumerate(getattr(layer, stacked))}


def test_without_the_patch_the_helper_refuses_before_building_anything(manager):
    with pytest.raises(LoRAFromTensorsUnavailableError, match="vllm.lora_from_tensors"):
        add_lora_from_tensors(manager, "policy", 1, adapter_tensors(seed=1), peft_config())
    assert manager.list_adapters() == set()


def test_plain_folder_requests_go_to_vllms_own_load(applied, manager):
    """The wrap changes nothing for a folder: vLLM's own errors and results, as before."""
    from vllm.exceptions import LoRAAdapterNotFoundError
    from vllm.lora.request import LoRARequest

    with pytest.raises(LoRAAdapterNotFoundError):
        manager._load_adapter(LoRARequest("nowhere", 1, "/nonexistent/adapter"))
    loaded = from_folder(manager, peft_config(), adapter_tensors(seed=1))
    assert len(loaded.loras) == 7


# --- the self-check ---


def test_lora_from_tensors_check_is_verified(applied, vllm_config):
    (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.lora_from_tensors")
def test_lora_from_tensors_check_fails_with_vllms_own_load_adapter(applied, vllm_config):
    with upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "vLLM's worker LoRA manager loads an adapter given as tensors: expected a LoRAModel, found " \
           "LoRAAdapterNotFoundError" in verdict.message, verdict.message
