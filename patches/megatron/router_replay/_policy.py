"""What a replaying router does with a missing target or with rows it cannot replay, and counts of it.

Two situations, two policies, each ``"raise"`` (the default) or ``"native"``:

- ``on_missing``: a router told to replay has no target (nothing set for ``REPLAY_FORWARD``, the
  ``REPLAY_BACKWARD`` queue empty). ``"raise"``: :class:`ReplayTargetMissingError`. ``"native"``:
  the router computes its own top-k for that pass, as verl and NeMo-RL do.
- ``on_invalid``: rows of the target hold an expert index outside ``[0, num_experts)`` — the ``-1``
  sentinel rollout engines write for tokens they have no routing for (sglang #36404), or rows from
  another model. Upstream gathers them unchecked (an index error on CPU, a device assert on CUDA).
  ``"raise"``: :class:`ReplayIndexInvalidError` naming the layer and the number of rows; this costs
  one host sync per layer and replayed pass (the check's result decides whether to raise).
  ``"native"``: those rows take the router's own top-k choice, the other rows replay; no host sync.

Every fallback is counted per router (``router_replay.fallbacks()``): missing passes as an
int, invalid rows as a device tensor summed without a sync until read. The first missing-target
fallback of each router is also logged at WARNING, so a silent fallback is visible.

State lives on the replay objects (``_patchkit_*`` attributes), so a model-scoped policy and the
process-wide default (this module's :data:`DEFAULTS`) coexist; a router without its own policy
follows the default.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("patchkit.megatron.router_replay")

RAISE = "raise"
NATIVE = "native"
POLICIES = (RAISE, NATIVE)
SETTINGS = ("on_missing", "on_invalid")

DEFAULTS: dict[str, str] = {"on_missing": RAISE, "on_invalid": RAISE}
"""Process-wide defaults; ``router_replay.set_policy`` changes them."""


def check_policy(setting: str, value: str) -> str:
    if value not in POLICIES:
        raise ValueError(f"{setting} must be one of {list(POLICIES)}; got {value!r}")
    return value


def policy_of(replay: Any, setting: str) -> str:
    """The router's own policy for ``setting``, else the process default."""
    own = getattr(replay, f"_patchkit_{setting}", None)
    return own if own is not None else DEFAULTS[setting]


def set_router_policy(replay: Any, setting: str, value: str | None) -> None:
    setattr(replay, f"_patchkit_{setting}", None if value is None else check_policy(setting, value))


def count_missing(replay: Any, layer: Any, action: str) -> None:
    counts = _counts(replay)
    if counts["missing"] == 0:
        logger.warning(
            "MoE layer %s: %s with no target; the router computes its own top-k (on_missing='native'); "
            "router_replay.fallbacks() counts these",
            layer, action,
        )
    counts["missing"] += 1


def count_invalid_rows(replay: Any, rows: Any) -> None:
    """Add a (device) tensor count of rows that fell back; summed lazily, no host sync here."""
    counts = _counts(replay)
    counts["invalid_rows"] = counts["invalid_rows"] + rows


def fallback_counts(replay: Any) -> dict[str, int]:
    counts = getattr(replay, "_patchkit_fallbacks", None)
    if counts is None:
        return {"missing": 0, "invalid_rows": 0}
    return {"missing": int(counts["missing"]), "invalid_rows": int(counts["invalid_rows"])}


def reset_counts(replay: Any) -> None:
    if hasattr(replay, "_patchkit_fallbacks"):
        del replay._patchkit_fallbacks


def _counts(replay: Any) -> dict[str, Any]:
    counts = getattr(replay, "_patchkit_fallbacks", None)
    if counts is None:
        counts = {"missing": 0, "invalid_rows": 0}
        replay._patchkit_fallbacks = counts
    return counts
