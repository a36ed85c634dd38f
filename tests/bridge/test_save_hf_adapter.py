"""``bridge.save_hf_adapter``: ``AutoBridge.save_hf_adapter`` (LoRA adapters as a HuggingFace PEFT folder).

Bridge 0.3 has no such method (AReaL adds one); the patch adds Bridge 0.4.2's. The same assertions run
on 0.3.1 (patched) and on 0.4.2, 0.5.1, 0.6.2 (upstream's own method): a tiny Llama built by Bridge from
a HuggingFace config, LoRA from Bridge's ``peft.lora``, saved and read back with safetensors.
Environments: modelopt-0.47-bridge-0.3, modelopt-0.47-bridge-0.4, modelopt-0.44-bridge-0.5,
modelopt-0.48-bridge-0.6 (0.2.0rc6 has no adapter export: unsupported there).
"""

from __future__ import annotations

import pytest
import torch
from doctor_verdicts import bypassed_verdict, verdict_of
from patchkit.patches.bridge._checks.save_hf_adapter import (
    LLAMA_TARGET_MODULES,
    LORA_ALPHA,
    LORA_DIM,
    exported_adapters,
    save_and_read,
    tiny_llama_with_lora,
)
from te_harness import bridge_import_context

import patchkit
from patchkit.doctor import FAILED, VERIFIED
from patchkit.runtime.status import Reason

PATCH = "bridge.save_hf_adapter"

with bridge_import_context():
    import megatron.bridge.models.conversion.auto_bridge as auto_bridge
    import megatron.bridge.peft.lora  # noqa: F401
    import megatron.bridge.peft.utils as peft_utils

if not hasattr(auto_bridge.AutoBridge, "export_adapter_weights"):
    pytest.skip("this Bridge has no adapter export (0.2)", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("patches_restored", "megatron_cpu", "local_lora")


@pytest.fixture
def local_lora(monkeypatch):
    """LoRA on Megatron's local linears: TransformerEngine is an import stub here, not layer classes."""
    monkeypatch.setattr(peft_utils, "HAVE_TE", False)


@pytest.fixture
def tiny_lora():
    return tiny_llama_with_lora()


def _native() -> bool:
    with patchkit.applied(PATCH) as (record,):
        return record.reason is Reason.NATIVE


def test_upstream_has_save_hf_adapter_from_0_4_only():
    """Upstream pinned: the method the patch adds is missing on 0.3 and Bridge's own from 0.4."""
    assert hasattr(auto_bridge.AutoBridge, "save_hf_adapter") == _native()


def test_saves_every_exported_adapter_under_peft_names(applied, tiny_lora):
    bridge, model, lora = tiny_lora
    config, tensors = save_and_read(bridge, model, lora)
    expected = exported_adapters(bridge, model)
    assert len(expected) == 28  # 2 layers x 7 HF modules x (A, B)
    assert sorted(tensors) == sorted(expected)
    for name, tensor in expected.items():
        assert tensors[name].dtype == torch.float32
        assert torch.equal(tensors[name], tensor), name
    assert any(tensor.abs().sum() > 0 for name, tensor in tensors.items() if "lora_B" in name)


def test_writes_a_peft_lora_config(applied, tiny_lora):
    bridge, model, lora = tiny_lora
    config, _ = save_and_read(bridge, model, lora)
    assert config["peft_type"] == "LORA"
    assert config["task_type"] == "CAUSAL_LM"
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (LORA_DIM, LORA_ALPHA, lora.dropout)
    assert config["target_modules"] == LLAMA_TARGET_MODULES
    assert config["base_model_name_or_path"] == "tiny-llama"
    assert config["use_dora"] is False


def test_save_hf_adapter_check_is_verified(applied):
    verdict = verdict_of(PATCH)
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("bridge.save_hf_adapter")
def test_save_hf_adapter_check_fails_without_the_method(applied, monkeypatch):
    def without_the_method() -> None:
        monkeypatch.delattr(auto_bridge.AutoBridge, "save_hf_adapter")

    verdict = bypassed_verdict(PATCH, applied.reason is Reason.NATIVE, without_the_method)
    assert verdict.verdict == FAILED
    assert "AutoBridge.save_hf_adapter: expected a method, found absent" in verdict.message, verdict.message
