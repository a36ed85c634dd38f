"""A tiny Llama-shaped decoder layer of vLLM's own linear layers, under vLLM's worker LoRA manager.

Shared by the ``vllm.lora_from_tensors`` self-check and its tests (tests/vllm/test_lora_from_tensors.py).
The smallest real vLLM object that calls ``_load_adapter`` is the worker's ``LRUCacheWorkerLoRAManager``
(what ``LoRAModelRunnerMixin.load_lora_model`` builds in every release 0.24-0.33): it is built here as
the model runner builds it, then ``create_lora_manager`` wraps the model's layers in vLLM's LoRA layers
(``LRUCacheLoRAModelManager``, CPU punica wrapper). The model is ``QKVParallelLinear`` /
``RowParallelLinear`` / ``MergedColumnParallelLinear`` with Llama's names and packed-module mapping,
so an adapter for it has PEFT's names for a Llama (``base_model.model.model.layers.0.self_attn.q_proj...``).

Stand-in: the ``vllm_config`` handed to the managers carries only the fields they read
(``scheduler_config.max_num_seqs`` / ``max_num_batched_tokens``, ``model_config`` vocabulary size, text
config and ``is_encoder_decoder``, ``lora_config``, ``parallel_config``); a real ``ModelConfig``
resolves a Hugging Face config and inspects vLLM's model registry in a subprocess (a minute on a busy
2-core machine). Everything the adapter passes through (``PEFTHelper``, ``LoRAModel``, the LoRA
layers, the LRU caches) is vLLM's.

:func:`unpinned_without_cuda`: vLLM 0.24's PyPI wheel on a machine without CUDA resolves no platform
while ``vllm.utils.torch_utils`` is imported, so its module-level ``PIN_MEMORY`` is the unspecified
platform's ``True`` and ``LoRAModel.from_lora_tensors`` pins every tensor (no driver: ``RuntimeError``),
whether the adapter comes from a folder or from tensors (and the model manager pins them again as it
adds them). Without CUDA, ``PIN_MEMORY`` of ``vllm.lora.lora_model``, ``lora_weights`` and
``model_manager`` is set to ``False`` (what vLLM's CPU platform answers) for the block; both sides of
every comparison run under it. In a fresh process on that wheel, vLLM's punica selector still holds the
unresolved platform once the CPU platform is made current: it is shown the current one while the manager
is created (``_punica_on_the_current_platform``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 64, 4, 2, 16, 96, 128
RANK, ALPHA, MAX_RANK = 4, 8, 8
LORA_DTYPE = torch.bfloat16
LAYER = "model.layers.0"
PEFT_PREFIX = "base_model.model."
#: module -> (input size, output size) of each module an adapter may target, as PEFT names them.
TARGETS = {
    "self_attn.q_proj": (HIDDEN, HEADS * HEAD_DIM),
    "self_attn.k_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
    "self_attn.v_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
    "self_attn.o_proj": (HEADS * HEAD_DIM, HIDDEN),
    "mlp.gate_proj": (HIDDEN, INTERMEDIATE),
    "mlp.up_proj": (HIDDEN, INTERMEDIATE),
    "mlp.down_proj": (INTERMEDIATE, HIDDEN),
}


@contextmanager
def unpinned_without_cuda() -> Iterator[None]:
    """``PIN_MEMORY`` False in vLLM's LoRA modules for the block where CUDA is absent (module docstring)."""
    import importlib

    modules = [importlib.import_module(f"vllm.lora.{name}") for name in ("lora_model", "lora_weights", "model_manager")]
    pinned = [module for module in modules if getattr(module, "PIN_MEMORY", False)]
    if torch.cuda.is_available():
        pinned = []
    for module in pinned:
        module.PIN_MEMORY = False  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in pinned:
            module.PIN_MEMORY = True  # type: ignore[attr-defined]


def tiny_model(hf_config: Any) -> torch.nn.Module:
    """One decoder layer's linear layers, built by vLLM (current vLLM config and model-parallel state needed)."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
    from vllm.model_executor.models.interfaces import SupportsLoRA

    class TinyLlamaLayers(torch.nn.Module, SupportsLoRA):
        packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
        embedding_modules: dict[str, str] = {}

        def __init__(self) -> None:
            super().__init__()
            self.config = hf_config  # read by vLLM's LoRA layer factory (from_layer)
            attn, mlp = torch.nn.Module(), torch.nn.Module()
            attn.qkv_proj = QKVParallelLinear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, bias=False,
                                              prefix=f"{LAYER}.self_attn.qkv_proj")
            attn.o_proj = RowParallelLinear(HEADS * HEAD_DIM, HIDDEN, bias=False, prefix=f"{LAYER}.self_attn.o_proj")
            mlp.gate_up_proj = MergedColumnParallelLinear(HIDDEN, [INTERMEDIATE] * 2, bias=False,
                                                          prefix=f"{LAYER}.mlp.gate_up_proj")
            mlp.down_proj = RowParallelLinear(INTERMEDIATE, HIDDEN, bias=False, prefix=f"{LAYER}.mlp.down_proj")
            layer = torch.nn.Module()
            layer.self_attn, layer.mlp = attn, mlp
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([layer])

    return TinyLlamaLayers()


def manager_config(max_loras: int = 2, max_cpu_loras: int = 2) -> Any:
    """What ``WorkerLoRAManager`` and ``LoRAModelManager`` read of a ``VllmConfig`` (module docstring)."""
    from transformers import LlamaConfig
    from vllm.config import ParallelConfig
    from vllm.config.lora import LoRAConfig

    hf_config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                            intermediate_size=INTERMEDIATE, vocab_size=VOCAB, num_hidden_layers=1,
                            max_position_embeddings=256)
    lora_config = LoRAConfig(max_lora_rank=MAX_RANK, max_loras=max_loras, max_cpu_loras=max_cpu_loras,
                             lora_dtype=LORA_DTYPE)
    model_config = SimpleNamespace(hf_config=hf_config, is_encoder_decoder=False, get_vocab_size=lambda: VOCAB)
    return SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=4, max_num_batched_tokens=64),
                           model_config=model_config, lora_config=lora_config, parallel_config=ParallelConfig())


def worker_lora_manager(**config: int) -> Any:
    """vLLM's ``LRUCacheWorkerLoRAManager`` over :func:`tiny_model`, created as vLLM's model runner creates it."""
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager

    vllm_config = manager_config(**config)
    manager = LRUCacheWorkerLoRAManager(vllm_config, torch.device("cpu"), embedding_modules={})
    with _punica_on_the_current_platform():
        manager.create_lora_manager(tiny_model(vllm_config.model_config.hf_config), vllm_config)
    return manager


@contextmanager
def _punica_on_the_current_platform() -> Iterator[None]:
    """vLLM 0.24's PyPI wheel without CUDA, in a fresh process (``patchkit doctor``): ``punica_selector``
    bound vLLM's unresolved platform at import (``from vllm.platforms import current_platform``), which
    names no punica wrapper (``NotImplementedError``), although ``_cpu_stand_in.cpu_platform`` has since
    made the CPU platform current. The selector sees the current platform while the manager is created."""
    import vllm.platforms as platforms
    from vllm.lora.punica_wrapper import punica_selector

    bound = punica_selector.current_platform
    if bound.device_type or not platforms.current_platform.device_type:
        yield
        return
    punica_selector.current_platform = platforms.current_platform
    try:
        yield
    finally:
        punica_selector.current_platform = bound


def peft_config(**overrides: Any) -> dict[str, Any]:
    """A PEFT ``adapter_config.json`` (as a dict) for a LoRA on every target module."""
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA, "bias": "none",
              "target_modules": sorted({name.rsplit(".", 1)[1] for name in TARGETS}), "lora_dropout": 0.0,
              "use_rslora": False, "use_dora": False, "modules_to_save": None}
    config.update(overrides)
    return config


def adapter_tensors(seed: int, rank: int = RANK, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """PEFT-named ``lora_A``/``lora_B`` tensors for every target module (non-zero ``lora_B``, as after training)."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (in_features, out_features) in TARGETS.items():
        name = f"{PEFT_PREFIX}{LAYER}.{module}"
        tensors[f"{name}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator).to(dtype)
        tensors[f"{name}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator).to(dtype)
    return tensors


@contextmanager
def peft_folder(config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Iterator[Path]:
    """The adapter as PEFT's ``save_pretrained`` writes it: ``adapter_config.json``, ``adapter_model.safetensors``."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="patchkit-lora-") as folder:
        path = Path(folder)
        (path / "adapter_config.json").write_text(json.dumps(config))
        save_file({name: tensor.contiguous() for name, tensor in tensors.items()},
                  str(path / "adapter_model.safetensors"))
        yield path


def describe(lora: Any) -> dict[str, Any]:
    """Everything of a ``LoRAModel`` that serving reads: id, rank, and per module rank, scaling, both tensors."""
    return {
        "id": lora.id,
        "rank": lora.rank,
        "modules": {name: (weights.rank, weights.scaling, weights.lora_alpha, weights.lora_a, weights.lora_b)
                    for name, weights in sorted(lora.loras.items())},
        "modules_to_save": sorted(getattr(lora, "modules_to_save", {}) or {}),
    }


def differences(ours: Any, theirs: Any) -> list[str]:
    """Where two ``LoRAModel`` differ (tensors compared bit for bit, with dtype and shape); [] when equal."""
    a, b = describe(ours), describe(theirs)
    found = [f"{key}: {a[key]!r} != {b[key]!r}" for key in ("id", "rank", "modules_to_save") if a[key] != b[key]]
    if a["modules"].keys() != b["modules"].keys():
        return [*found, f"modules: {sorted(a['modules'])} != {sorted(b['modules'])}"]
    for name, (rank, scaling, alpha, lora_a, lora_b) in a["modules"].items():
        rank_b, scaling_b, alpha_b, lora_a_b, lora_b_b = b["modules"][name]
        if (rank, scaling, alpha) != (rank_b, scaling_b, alpha_b):
            found.append(f"{name}: rank/scaling/alpha {(rank, scaling, alpha)} != {(rank_b, scaling_b, alpha_b)}")
        for half, mine, other in (("lora_a", lora_a, lora_a_b), ("lora_b", lora_b, lora_b_b)):
            if not _same_tensors(mine, other):
                found.append(f"{name}.{half}: {_spec(mine)} differs from {_spec(other)}")
    return found


def _same_tensors(mine: Any, other: Any) -> bool:
    """Bit for bit, dtype and shape included; packed modules (after vLLM adds an adapter) hold lists."""
    if isinstance(mine, list) or isinstance(other, list):
        return (isinstance(mine, list) and isinstance(other, list) and len(mine) == len(other)
                and all(_same_tensors(a, b) for a, b in zip(mine, other, strict=True)))
    if mine is None or other is None:
        return mine is other
    return bool(mine.dtype == other.dtype and mine.shape == other.shape and torch.equal(mine, other))


def _spec(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_spec(v) for v in value) + "]"
    return "None" if value is None else f"{value.dtype}{tuple(value.shape)}"
