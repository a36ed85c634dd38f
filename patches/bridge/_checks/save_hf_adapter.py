"""Self-check of ``bridge.save_hf_adapter``: ``AutoBridge.save_hf_adapter`` writes a tiny Llama's LoRA
adapters as a HuggingFace PEFT directory, the tensors equal to Bridge's own adapter export.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

#: The HF modules a LoRA on every Megatron linear of a Llama layer adapts.
LLAMA_TARGET_MODULES = ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
LORA_DIM, LORA_ALPHA = 4, 8


def tiny_llama_with_lora() -> tuple[Any, list[Any], Any]:
    """(bridge, model chunks, LoRA config): a 2-layer hidden-64 Llama from a HuggingFace config (no weights),
    built by Bridge's provider on local attention on CPU, with LoRA on its four linears (B filled with
    non-zero values so that an export that lost them shows)."""
    from megatron.bridge import AutoBridge
    from megatron.bridge.peft.lora import LoRA
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    config.architectures = ["LlamaForCausalLM"]
    bridge = AutoBridge.from_hf_config(config)
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.transformer_layer_spec = get_gpt_layer_local_spec()
    for name, value in dict(use_cpu_initialization=True, params_dtype=torch.float32, bf16=False,
                            apply_rope_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
                            gradient_accumulation_fusion=False, persist_layer_norm=False,
                            bias_dropout_fusion=False).items():
        setattr(provider, name, value)
    if hasattr(provider, "finalize"):
        provider.finalize()
    provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    torch.manual_seed(0)
    lora = LoRA(target_modules=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], dim=LORA_DIM,
                alpha=LORA_ALPHA)
    model = lora([provider.provide()], training=True)
    with torch.no_grad():
        for name, parameter in model[0].named_parameters():
            if "linear_out" in name:  # LoRA's B starts at zero
                parameter.normal_()
    return bridge, model, lora


def save_and_read(bridge: Any, model: list[Any], lora: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``bridge.save_hf_adapter`` into a fresh folder: (adapter_config.json, adapter_model.safetensors)."""
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as folder:
        bridge.save_hf_adapter(model, folder, peft_config=lora, base_model_name_or_path="tiny-llama",
                               show_progress=False)
        config = json.loads((Path(folder) / "adapter_config.json").read_text(encoding="utf-8"))
        return config, load_file(str(Path(folder) / "adapter_model.safetensors"))


def exported_adapters(bridge: Any, model: list[Any]) -> dict[str, torch.Tensor]:
    """Bridge's own adapter export, under the names PEFT gives them."""
    return {f"base_model.model.{name}": tensor.float()
            for name, tensor in bridge.export_adapter_weights(model, cpu=True, show_progress=False)}


def check_save_hf_adapter(context: CheckContext) -> None:
    """``AutoBridge.save_hf_adapter`` writes a tiny Llama's LoRA adapters as a HuggingFace PEFT directory."""
    from patchkit.patches.megatron._checks._harness import megatron_on

    with megatron_on("cpu"):
        bridge, model, lora = tiny_llama_with_lora()
        expect(callable(getattr(bridge, "save_hf_adapter", None)), "AutoBridge.save_hf_adapter", "a method",
               "absent" if not hasattr(bridge, "save_hf_adapter") else "not callable")
        config, tensors = save_and_read(bridge, model, lora)
        expected = exported_adapters(bridge, model)
    expect(sorted(tensors) == sorted(expected), "tensors in adapter_model.safetensors",
           f"the {len(expected)} exported adapters", sorted(set(tensors) ^ set(expected))[:4])
    unequal = [name for name in expected if not torch.equal(tensors[name], expected[name])]
    expect(not unequal, "saved adapter tensors", "equal to Bridge's export", unequal[:4])
    found = (config.get("peft_type"), config.get("r"), config.get("lora_alpha"), config.get("target_modules"))
    expect(found == ("LORA", LORA_DIM, LORA_ALPHA, LLAMA_TARGET_MODULES),
           "adapter_config.json (peft_type, r, lora_alpha, target_modules)",
           ("LORA", LORA_DIM, LORA_ALPHA, LLAMA_TARGET_MODULES), found)
