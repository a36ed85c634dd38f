"""Values the Megatron-Core patches, their helpers and their public APIs share.

A leaf module: it imports nothing from the family, so any module of it can import these without an
import cycle and without pulling in torch or Megatron.
"""

from __future__ import annotations

import enum


class Action(str, enum.Enum):
    """What every router does with its top-k selection in the next passes (router replay)."""

    RECORD = "record"
    REPLAY_FORWARD = "replay_forward"
    REPLAY_BACKWARD = "replay_backward"
