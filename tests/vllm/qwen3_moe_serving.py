"""vLLM's own ``Qwen3MoeForCausalLM`` for the recorded QAT export of a tiny Qwen3-MoE, and what it serves.

The export (``data/qwen3_moe_qat_export.pt``) is recorded by ``tests/export/qwen3_moe_recording.py``
in the environment that has Megatron-Core, ModelOpt and Megatron-Bridge (read its docstring); the
vLLM environments have none of them. Here the model is built by vLLM from the recorded
``config.json`` and the export's own quantization config, loaded only through vLLM's
``model.load_weights`` and processed by vLLM's ``process_weights_after_loading``, as vLLM's
``DefaultModelLoader`` does.

One stand-in, the same as tests/e2e's (docs/qat-export.md "Trainer to vLLM"): the export is W4A16
(``quant_algo`` ``W4A16_NVFP4``), which vLLM serves with Marlin (CUDA only, MoE included). On CPU
the NVFP4 kernels are the emulation kernels of vLLM's W4A4 method, so the engine is configured with
``quant_algo`` ``NVFP4`` and every quantized linear gets an ``input_scale`` of 1.0
(``with_input_scales``). The weight path under test (names -> vLLM's loaders -> processing -> the
tensors the kernels dequantize) is the same; the config's exclusions (``ignore``) and group size are
the export's. A second, for the unquantized layers (router, embeddings): on a CPU with AMX tiles,
vLLM's CPU processing packs a bf16 weight for its AMX GEMM with vLLM's ``_C`` ops, which the PyPI
(CUDA) wheel lacks; ``no_amx_gemm`` answers "no AMX" so vLLM keeps the weight as loaded (its path
for CPUs without AMX).

vLLM creates its expert-parallel group only when the model it was initialised for is an MoE; the
session harness initialised it for a dense Llama, so ``expert_parallel_group`` adds the group vLLM
itself would have made at world size 1, for the MoE tests only.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

RECORDING = Path(__file__).resolve().parent / "data" / "qwen3_moe_qat_export.pt"
BLOCK = 16
INPUT_SCALE = 1.0


@functools.lru_cache(maxsize=1)
def recording() -> dict[str, Any]:
    recorded = torch.load(RECORDING, weights_only=True)
    assert recorded["format"] == 1, recorded["format"]
    return recorded


def stream(layout: str) -> list[tuple[str, torch.Tensor]]:
    """The recorded ``export_qat_weights(..., expert_layout=layout)`` stream, in order."""
    return list(recording()["streams"][layout])


def trained() -> dict[str, torch.Tensor]:
    """Hugging Face name -> the weight the trainer's QAT forward multiplies."""
    return dict(recording()["trained"])


def with_input_scales(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """The stream plus an ``input_scale`` (1.0) after every quantized tensor's global scale.

    A fused ``w13_weight_scale_2`` of shape ``[E, 2]`` gets an input scale of the same shape.
    """
    for name, tensor in weights:
        yield name, tensor
        if name.endswith("weight_scale_2"):
            yield name[: -len("weight_scale_2")] + "input_scale", torch.full_like(tensor, INPUT_SCALE)


def engine_config(model_dir: Path) -> Any:
    """A ``VllmConfig`` for the recorded model, quantization as the export describes it (W4A4 on CPU, see above)."""
    from vllm.config import ModelConfig, VllmConfig

    quantization = copy.deepcopy(recording()["quant_config"]["quantization_config"])
    quantization["quant_algo"] = "NVFP4"
    config = json.loads(recording()["hf_config"])
    config["quantization_config"] = quantization
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="bfloat16")
    vllm_config = VllmConfig(model_config=model_config)
    assert type(vllm_config.quant_config).__name__ == "ModelOptNvFp4Config", vllm_config.quant_config
    return vllm_config


@contextlib.contextmanager
def no_amx_gemm() -> Iterator[None]:
    """``torch.cpu._is_amx_tile_supported`` answers False (see the module docstring)."""
    supported = torch.cpu._is_amx_tile_supported
    torch.cpu._is_amx_tile_supported = lambda: False
    try:
        yield
    finally:
        torch.cpu._is_amx_tile_supported = supported


@contextlib.contextmanager
def expert_parallel_group() -> Iterator[None]:
    """vLLM's expert-parallel group at world size 1 (what ``initialize_model_parallel`` makes for an MoE)."""
    from vllm.distributed import parallel_state

    if parallel_state._EP is not None:
        yield
        return
    world = parallel_state.get_world_group()
    parallel_state._EP = parallel_state.init_model_parallel_group(
        [[world.rank]], world.local_rank, torch.distributed.get_backend(world.cpu_group), group_name="ep")
    try:
        yield
    finally:
        parallel_state._EP.destroy()
        parallel_state._EP = None


def new_model(model_dir: Path) -> tuple[torch.nn.Module, Any]:
    """A fresh ``Qwen3MoeForCausalLM`` and its own ``VllmConfig`` (vLLM registers each attention and MoE
    layer by name in the config's forward context; the names must stay the checkpoint's for the
    config's exclusions to match, so every model gets a config of its own)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

    vllm_config = engine_config(model_dir)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(vllm_config.model_config.dtype)  # as vLLM's model loader builds a model
    try:
        with set_current_vllm_config(vllm_config):
            return Qwen3MoeForCausalLM(vllm_config=vllm_config), vllm_config
    finally:
        torch.set_default_dtype(default_dtype)


def load(model: torch.nn.Module, vllm_config: Any, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """What vLLM's ``DefaultModelLoader.load_weights`` does with a weights iterator, minus its completeness check:
    ``model.load_weights``, then ``process_weights_after_loading``. Returns what ``load_weights`` returned."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with set_current_vllm_config(vllm_config):
        loaded = model.load_weights(weights)
        process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    return set(loaded or ())


def _dequantized(weight: torch.Tensor, weight_scale: torch.Tensor, global_scale: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """What vLLM's NVFP4 emulation kernels multiply: vLLM's own ``dequantize_to_dtype``."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    return dequantize_to_dtype(weight.data.view(torch.uint8), weight_scale.data, global_scale.reshape(-1),
                               dtype, BLOCK, swizzle=False)


def _linear(layer: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
    return _dequantized(layer.weight, layer.weight_scale, layer.weight_global_scale, dtype)


def routed_experts(block: torch.nn.Module) -> torch.nn.Module:
    """The module holding ``w13_weight``/``w2_weight`` of a ``Qwen3MoeSparseMoeBlock``."""
    experts = block.experts
    return getattr(experts, "routed_experts", experts)


def served(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Hugging Face name -> the weight vLLM serves there (dequantized for NVFP4 layers)."""
    dtype = torch.bfloat16
    config = model.config
    head_dim = config.head_dim
    q_rows = config.num_attention_heads * head_dim
    kv_rows = config.num_key_value_heads * head_dim
    result = {
        "model.embed_tokens.weight": model.model.embed_tokens.weight.data,
        "model.norm.weight": model.model.norm.weight.data,
        "lm_head.weight": model.lm_head.weight.data,
    }
    for index, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{index}"
        attn = layer.self_attn
        qkv = _linear(attn.qkv_proj, dtype)
        result[f"{prefix}.self_attn.q_proj.weight"] = qkv[:q_rows]
        result[f"{prefix}.self_attn.k_proj.weight"] = qkv[q_rows: q_rows + kv_rows]
        result[f"{prefix}.self_attn.v_proj.weight"] = qkv[q_rows + kv_rows:]
        result[f"{prefix}.self_attn.o_proj.weight"] = _linear(attn.o_proj, dtype)
        result[f"{prefix}.self_attn.q_norm.weight"] = attn.q_norm.weight.data
        result[f"{prefix}.self_attn.k_norm.weight"] = attn.k_norm.weight.data
        result[f"{prefix}.input_layernorm.weight"] = layer.input_layernorm.weight.data
        result[f"{prefix}.post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.data
        result[f"{prefix}.mlp.gate.weight"] = layer.mlp.gate.weight.data
        experts = routed_experts(layer.mlp)
        w13 = _dequantized(experts.w13_weight, experts.w13_weight_scale, experts.w13_weight_scale_2, dtype)
        w2 = _dequantized(experts.w2_weight, experts.w2_weight_scale, experts.w2_weight_scale_2, dtype)
        rows = w13.shape[1] // 2
        for expert in range(w13.shape[0]):
            base = f"{prefix}.mlp.experts.{expert}"
            result[f"{base}.gate_proj.weight"] = w13[expert, :rows]
            result[f"{base}.up_proj.weight"] = w13[expert, rows:]
            result[f"{base}.down_proj.weight"] = w2[expert]
    return result


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


def differing(model: torch.nn.Module, reference: dict[str, torch.Tensor]) -> list[str]:
    """The Hugging Face names whose served weight is not ``reference``'s, bit for bit.

    NVFP4 weights are dequantized in the engine's dtype (bf16, the trainer's too). A plain parameter
    is compared with the reference cast to the served dtype, as vLLM's loader casts it: the engine
    keeps every plain parameter in bf16, Megatron keeps its norm weights in float32.
    """
    serving = served(model)
    assert serving.keys() == reference.keys(), sorted(serving.keys() ^ reference.keys())
    return [name for name, want in reference.items()
            if serving[name].shape != want.shape
            or not torch.equal(bits(serving[name]), bits(want.to(serving[name].dtype)))]
