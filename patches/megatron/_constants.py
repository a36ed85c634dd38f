"""Values the Megatron-Core patches, their declarations, helpers and public APIs share.

A leaf module: it imports nothing from the catalogue, so any module (a declaration included) can
import these without an import cycle and without pulling in torch or Megatron.
"""

from __future__ import annotations

import enum

#: ``version_modules`` of every Megatron-Core patch: the package whose ``__version__`` names the release
#: when megatron-core is installed without metadata (a git checkout).
MEGATRON_CORE = {"megatron-core": "megatron.core"}

# Modules the declarations patch.
DSA = "megatron.core.transformer.experimental_attention_variant.dsa"
GPT_MODEL = "megatron.core.models.gpt.gpt_model"
MTP = "megatron.core.transformer.multi_token_prediction"
ROUTER = "megatron.core.transformer.moe.router"
TOKEN_DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"


class Action(str, enum.Enum):
    """What every router does with its top-k selection in the next passes (router replay)."""

    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"
