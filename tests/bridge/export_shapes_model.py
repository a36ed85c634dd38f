"""A tiny Llama for the ``export_shapes`` tests: a Hugging Face checkpoint on disk, read back by Bridge.

``AutoBridge.from_hf_pretrained(folder)`` is what RL frameworks call, and the only form every claimed
Bridge exports from: 0.2 cannot build a provider from a bare config, and 0.3 orders its export by the
checkpoint's safetensors index. The model is built by Bridge's provider on CPU (local layer spec, fusions
off), in bf16, with tensor parallelism when Megatron's parallel state has it. Bridge must already be
imported (the conftest, or ``ep_worker.load_upstreams`` in a spawned rank).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

CONFIG = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=128, max_position_embeddings=64, tie_word_embeddings=False)


def save_checkpoint(folder: Path) -> Path:
    """A randomly initialised tiny Llama saved as a Hugging Face checkpoint in ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG)
    config.architectures = ["LlamaForCausalLM"]
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(str(folder))
    return folder


def build(folder: Path, tensor_parallel: int = 1, pipeline_parallel: int = 1) -> tuple[Any, list[Any]]:
    """``(bridge, model chunks)`` from the checkpoint; call with Megatron's parallel state initialised."""
    from megatron.bridge import AutoBridge
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.process_groups_config import ProcessGroupCollection

    bridge = AutoBridge.from_hf_pretrained(str(folder))
    provider = bridge.to_megatron_provider(load_weights=False)
    provider.transformer_layer_spec = get_gpt_layer_local_spec()
    for name, value in dict(use_cpu_initialization=True, params_dtype=torch.bfloat16, bf16=True,
                            tensor_model_parallel_size=tensor_parallel,
                            pipeline_model_parallel_size=pipeline_parallel, pipeline_dtype=torch.bfloat16,
                            apply_rope_fusion=False,
                            bias_activation_fusion=False, masked_softmax_fusion=False,
                            gradient_accumulation_fusion=False, persist_layer_norm=False,
                            bias_dropout_fusion=False).items():
        setattr(provider, name, value)
    if hasattr(provider, "finalize"):
        provider.finalize()
    if "_pg_collection" in getattr(provider, "__dataclass_fields__", {}):  # 0.3+; on 0.2 the attribute would
        # ride along in the model config, which Bridge 0.2 pickles to the other pipeline stages
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
    torch.manual_seed(1)
    return bridge, [provider.provide()]


def conversion_tasks(bridge: Any, model: list[Any]) -> list[Any]:
    """The tasks ``export_hf_weights`` builds for itself (what a framework caches between refits)."""
    return bridge._model_bridge.build_conversion_tasks(bridge.hf_pretrained, model)


def upstream_export(bridge: Any, model: list[Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """Bridge's own ``export_hf_weights``: (name, shape, dtype) of each tensor, in its order."""
    return [(name, tuple(tensor.shape), str(tensor.dtype))
            for name, tensor in bridge.export_hf_weights(model, cpu=True, show_progress=False)]


def as_rows(shapes: Any) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, tuple(shape), str(dtype)) for name, shape, dtype in shapes]
