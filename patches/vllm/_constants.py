"""Values the vLLM patches, their helpers and the refit API share.

A leaf module: it imports nothing from the family, so the refit API and the implementation below it
read the same name without an import cycle and without pulling in torch or vLLM.
"""

from __future__ import annotations

#: ModelOpt NVFP4's refit patch, the first refit format: ``patchkit.patches.vllm.refit`` re-exports it
#: as ``PATCH_ID``, and ``refit_mode`` names its state first when no refit patch is installed. Every
#: refit patch is named by a row of the format table (``refit._formats.FORMATS``).
NVFP4_REFIT_PATCH_ID = "vllm.nvfp4_refit"

#: The patch that makes vLLM's worker take a LoRA adapter from tensors (``patchkit.patches.vllm.lora``
#: re-exports it as ``PATCH_ID``).
LORA_FROM_TENSORS_PATCH_ID = "vllm.lora_from_tensors"
