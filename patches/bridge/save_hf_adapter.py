"""Megatron-Bridge's ``AutoBridge.save_hf_adapter`` on Bridge 0.3.

Declaration module (data only; see docs/writing-patches.md). Bridge 0.4 added
``AutoBridge.save_hf_adapter(model, path, peft_config, ...)``: the LoRA adapters of a Megatron model
written as a HuggingFace PEFT directory (``adapter_config.json`` and ``adapter_model.safetensors``,
loadable by ``peft.PeftModel.from_pretrained``). Bridge 0.3 has the export it builds on
(``AutoBridge.export_adapter_weights``) but not the method, so AReaL adds it when it is missing
(``areal/engine/megatron_utils/megatron_lora.py``, ``_monkey_patch_save_hf_adapter``). The patch adds
Bridge 0.4.2's own method, with its two helpers (``peft_bridge.infer_target_modules_from_adapter_weights``
and ``build_adapter_config_dict``).

Ranges, from the wheels: 0.3.1 has ``export_adapter_weights`` and no ``save_hf_adapter``; 0.4.2, 0.5.1
and 0.6.2 have both (0.6 also exports MoE expert adapters and a ``rank_pattern``); 0.2.0rc6 has neither,
and no variant serves it. Tests ran on 0.3.1 (patched), 0.4.2, 0.5.1 and 0.6.2 (native), each with the
same assertions.
"""

from __future__ import annotations

from patchkit import Add, Patch, Variant

from ._constants import BRIDGE, V03, V04_V06

AUTO_BRIDGE = "megatron.bridge.models.conversion.auto_bridge"

PATCHES = (
    Patch(
        id="bridge.save_hf_adapter",
        self_check="._checks.save_hf_adapter:check_save_hf_adapter",
        summary="AutoBridge.save_hf_adapter on Bridge 0.3: LoRA adapters saved as a HuggingFace PEFT directory.",
        why=(
            "Bridge 0.3 exports adapter weights but cannot save them for peft/vLLM LoRA loading; 0.4 added "
            "save_hf_adapter (AReaL adds the method when it is missing)."
        ),
        upstream=(
            "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.4.2/src/megatron/bridge/models/conversion/"
            "auto_bridge.py"
        ),
        removal="Native from Bridge 0.4; remove with support for Bridge 0.3.",
        version_modules=BRIDGE,
        variants=(
            Variant(
                requires=V03,
                installs=(Add(f"{AUTO_BRIDGE}:AutoBridge.save_hf_adapter", "._save_hf_adapter:save_hf_adapter"),),
                label="v042-backport",
            ),
            Variant(
                requires=V04_V06,
                native="AutoBridge.save_hf_adapter writes adapter_config.json and adapter_model.safetensors",
            ),
        ),
    ),
)
