"""Values the vLLM patches, their helpers and the refit API share.

A leaf module: it imports nothing from the family, so the refit API and the implementation below it
read the same name without an import cycle and without pulling in torch or vLLM.
"""

from __future__ import annotations

#: The patch whose state says whether refits are available (``refit.refit_mode``): the first refit
#: patch, ``vllm.nvfp4_refit``. ``patchkit.patches.vllm.refit`` re-exports it as ``PATCH_ID``.
REFIT_PATCH_ID = "vllm.nvfp4_refit"
