"""Values the Megatron-Bridge declarations share: the distribution, the modules they patch, the release ranges.

A leaf module: it imports nothing, so a declaration module reads these without importing Bridge.
"""

from __future__ import annotations

#: ``version_modules`` of every Bridge patch: the package whose ``__version__`` names the release when
#: Bridge is installed without metadata (a git checkout).
BRIDGE = {"megatron-bridge": "megatron.bridge"}
#: The sources the QAT patches were written against.
BLOB = "https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/v0.3.1/src/megatron/bridge/models"

MODEL_BRIDGE = "megatron.bridge.models.conversion.model_bridge"
PARAM_MAPPING = "megatron.bridge.models.conversion.param_mapping"
GPT_PROVIDER = "megatron.bridge.models.gpt_provider"
TRAIN_UTILS = "megatron.bridge.training.utils.train_utils"

# Release ranges (pre-releases of the next release excluded).
V02 = {"megatron-bridge": ">=0.2.0rc0,<0.3.0rc0"}
V03 = {"megatron-bridge": ">=0.3.0rc0,<0.4.0rc0"}
V04 = {"megatron-bridge": ">=0.4.0rc0,<0.5.0rc0"}
V05 = {"megatron-bridge": ">=0.5.0rc0,<0.6.0rc0"}
V06 = {"megatron-bridge": ">=0.6.0rc0,<0.7.0rc0"}
V02_V03 = {"megatron-bridge": ">=0.2.0rc0,<0.4.0rc0"}
V02_V04 = {"megatron-bridge": ">=0.2.0rc0,<0.5.0rc0"}
V040_V041 = {"megatron-bridge": ">=0.4.0rc0,<0.4.2rc0"}
V042 = {"megatron-bridge": ">=0.4.2rc0,<0.5.0rc0"}
V04_V06 = {"megatron-bridge": ">=0.4.0rc0,<0.7.0rc0"}
V05_V06 = {"megatron-bridge": ">=0.5.0rc0,<0.7.0rc0"}
