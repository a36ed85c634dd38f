"""vLLM's worker LoRA manager loads an adapter handed over as tensors and a PEFT config, not a folder.

Declaration only (see docs/writing-patches.md). The public API is ``patchkit.patches.vllm.lora``
(``add_lora_from_tensors``, ``TensorLoRARequest``); the loading is ``_lora_from_tensors``.

What upstream does (``vllm/lora/worker_manager.py``, ``WorkerLoRAManager._load_adapter``, read in every
wheel 0.24.0-0.33.0): resolve ``lora_request.lora_path`` (a local folder or a Hugging Face repo), read
``adapter_config.json`` (``PEFTHelper.from_local_dir``) and ``adapter_model.safetensors``/``.bin``
(``LoRAModel.from_local_checkpoint``, which ends in ``LoRAModel.from_lora_tensors``). There is no way
to pass the tensors themselves: RL frameworks that sync a LoRA policy to their rollout engine every
step either write it to disk or replace ``_load_adapter`` (verl's ``VLLMHijack`` on
``LRUCacheWorkerLoRAManager``, ROLL's ``patch_vllm_lora_manager`` on ``WorkerLoRAManager``, SkyRL for
0.28). ``LRUCacheWorkerLoRAManager`` inherits ``_load_adapter``, so the wrap on the base class serves
both managers.

Variants follow ``_load_adapter``'s six bodies (``_lora_from_tensors.ReleaseSteps``): 0.24; 0.25-0.28
(``get_unstacked_mapper``); 0.29-0.30 (``get_rename_mapper``); 0.31 (classification validations);
0.32 (MoE format validation); 0.33 (one classification-head validation). Tested on 0.24, 0.29 and
0.33; the others read from their wheels. No range is ``native``: vLLM RFC #48297 (open) proposes it;
#4068 was closed stale.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

LOAD_ADAPTER = "vllm.lora.worker_manager:WorkerLoRAManager._load_adapter"
_IMPL = "._lora_from_tensors"

PATCHES = (
    Patch(
        id="vllm.lora_from_tensors",
        self_check="._checks.lora_from_tensors:check_lora_from_tensors",
        summary=(
            "vLLM's worker LoRA manager loads a TensorLoRARequest (PEFT config dict + {name: tensor}) from "
            "memory into the same LoRAModel a PEFT folder gives; bad tensors refused by name, nothing loaded."
        ),
        why=(
            "vLLM reads LoRA adapters only from a folder (LoRARequest.lora_path); RL trainers push a new "
            "adapter to the rollout engine every step, and verl, ROLL and SkyRL each replace _load_adapter "
            "to skip the disk round-trip."
        ),
        upstream=(
            "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/lora/worker_manager.py; "
            "vllm-project/vllm#48297 (RFC, open), #4068 (closed stale)"
        ),
        removal=(
            "Declare native once vLLM loads an adapter from tensors itself (RFC #48297); "
            "tests/vllm/test_lora_from_tensors.py::test_vllm_alone_* says when."
        ),
        version_modules={"vllm": "vllm"},
        variants=(
            Variant(requires={"vllm": ">=0.24,<0.25"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v024"),), label="hf-mapper"),
            Variant(requires={"vllm": ">=0.25,<0.29"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v025"),), label="unstacked-mapper"),
            Variant(requires={"vllm": ">=0.29,<0.31"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v029"),), label="rename-mapper"),
            Variant(requires={"vllm": ">=0.31,<0.32"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v031"),),
                    label="classification-validations"),
            Variant(requires={"vllm": ">=0.32,<0.33"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v032"),), label="moe-format-validation"),
            Variant(requires={"vllm": ">=0.33,<0.34"},
                    installs=(Wrap(LOAD_ADAPTER, f"{_IMPL}:wrap_load_adapter_v033"),),
                    label="classification-head-validation"),
        ),
    ),
)
