"""``AutoBridge.save_hf_adapter`` for Bridge 0.3: Bridge 0.4.2's method and helpers, unchanged in behaviour.

The adapters come from Bridge 0.3's own ``export_adapter_weights`` (HuggingFace names, gathered over
TP/PP/EP on every rank); rank 0 writes them, each prefixed ``base_model.model.`` and in float32, to
``adapter_model.safetensors``, and the PEFT config (rank, alpha, dropout and the target modules read
off the weight names) to ``adapter_config.json``. Collective, like upstream's: every rank calls it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
from megatron.bridge.peft.dora import DoRA
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

_HF_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight")


def infer_target_modules_from_adapter_weights(adapter_weight_names: Iterable[str]) -> list[str]:
    """The HF ``target_modules`` (``q_proj``, ``gate_proj``...) of HF-format adapter weight names."""
    modules: set[str] = set()
    for name in adapter_weight_names:
        for suffix in _HF_LORA_SUFFIXES:
            if name.endswith(suffix):
                modules.add(name[: -len(suffix)].rsplit(".", 1)[-1])
                break
    return sorted(modules)


def build_adapter_config_dict(peft_config: Any, target_modules: list[str],
                              base_model_name_or_path: str | None = None) -> dict[str, object]:
    """An ``adapter_config.json`` that ``peft.PeftModel.from_pretrained`` loads (Bridge 0.4.2's fields)."""
    return {
        "peft_type": "LORA",
        "auto_mapping": None,
        "base_model_name_or_path": base_model_name_or_path or "",
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "lora_alpha": getattr(peft_config, "alpha", 32),
        "lora_dropout": getattr(peft_config, "dropout", 0.0),
        "modules_to_save": None,
        "r": getattr(peft_config, "dim", 32),
        "rank_pattern": {},
        "alpha_pattern": {},
        "target_modules": target_modules,
        "task_type": "CAUSAL_LM",
        "use_dora": isinstance(peft_config, DoRA),
        "use_rslora": False,
    }


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def save_hf_adapter(self: Any, model: Any, path: str | Path, peft_config: Any,
                    base_model_name_or_path: str | None = None, show_progress: bool = True) -> None:
    """Save the model's LoRA adapters as a HuggingFace PEFT directory (``adapter_config.json`` and
    ``adapter_model.safetensors``). Collective: all ranks call it; rank 0 writes.

    ``base_model_name_or_path`` defaults to the bridge's ``hf_pretrained`` model path.
    """
    if _distributed():
        dist.barrier()

    adapter_state: dict[str, torch.Tensor] = {}
    for name, tensor in self.export_adapter_weights(model, cpu=True, show_progress=show_progress):
        adapter_state[f"base_model.model.{name}"] = tensor.clone().float()

    if not adapter_state:
        raise RuntimeError(
            "No adapter weights were found on the model. "
            "Ensure the model has PEFT adapters applied before calling save_hf_adapter()."
        )

    if not _distributed() or dist.get_rank() == 0:
        save_dir = Path(path)
        save_dir.mkdir(parents=True, exist_ok=True)
        if base_model_name_or_path is None:
            base_model_name_or_path = str(
                getattr(self.hf_pretrained, "model_name_or_path", "")
                or getattr(self.hf_pretrained, "name_or_path", "")
            )
        adapter_config = build_adapter_config_dict(
            peft_config,
            target_modules=infer_target_modules_from_adapter_weights(adapter_state.keys()),
            base_model_name_or_path=base_model_name_or_path,
        )
        with open(save_dir / "adapter_config.json", "w") as f:
            json.dump(adapter_config, f, indent=2)
        save_file(adapter_state, str(save_dir / "adapter_model.safetensors"))
        logger.info("patchkit: saved %d LoRA adapter tensors to %s", len(adapter_state), save_dir)

    if _distributed():
        dist.barrier()
