"""``MaxCalibrator.collect`` with non-finite inputs zero-filled first (ModelOpt 0.43-0.48).

NeMo-RL's ``_tolerate_dummy_weight_nan_amax`` (``vllm_quant_patch.py``), as a patch: an input that is
not on the meta device, not empty and not all finite goes through ``torch.nan_to_num(x, nan=0.0,
posinf=0.0, neginf=0.0)``, then to upstream's ``collect``. A fully non-finite input so gives an amax
of 0, a partly non-finite one the amax of its finite values (and 0 where a reduced slice had none);
finite inputs, and the meta device ModelOpt initialises on, reach upstream unchanged.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

import torch

logger = logging.getLogger(__name__)


def wrap_collect(original: Callable[[Any, torch.Tensor], None]) -> Callable[[Any, torch.Tensor], None]:
    """Upstream's ``collect`` on ``x`` with NaN and +/-inf replaced by 0."""

    @functools.wraps(original)
    @torch.no_grad()
    def collect(self: Any, x: torch.Tensor) -> None:
        if x.device.type != "meta" and x.numel() > 0 and not torch.isfinite(x).all():
            logger.debug("patchkit: MaxCalibrator.collect: non-finite values in a %s input zero-filled",
                         tuple(x.shape))
            x = torch.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)
        original(self, x)

    return collect
