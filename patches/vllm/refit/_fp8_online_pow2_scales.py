"""``vllm.fp8_online_pow2_scales``: vLLM's online-FP8 weight scales rounded up to powers of two.

NeMo-RL's rule (``nemo_rl/models/generation/vllm/quantization/fp8.py``, ``cast_tensor_to_fp8_blockwise``
with ``use_weight_pow2_scale``), on the scale vLLM derives (amax / 448): the exponent
``ceil(log2(scale))``, clamped to [-127, 127]; the scale is ``2 ** exponent``, and 1.0 where the exponent
is -127 (an all-zero weight: NeMo-RL's biased exponent 0). Rounding up keeps every ``weight / scale``
within E4M3's range, and a power-of-two scale makes the quantised value exact whether a kernel divides by
the scale or multiplies by its reciprocal.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

#: the least exponent NeMo-RL's E8M0-style encoding keeps; a scale that rounds to it becomes 1.0
_MIN_EXPONENT, _MAX_EXPONENT = -127, 127


def power_of_two_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` rounded up to a power of two, by NeMo-RL's rule (module docstring); same shape and dtype."""
    exponent = torch.ceil(torch.log2(scale.float())).clamp(_MIN_EXPONENT, _MAX_EXPONENT)
    rounded = torch.where(exponent == _MIN_EXPONENT, torch.ones_like(exponent), torch.exp2(exponent))
    return rounded.to(scale.dtype)


def wrap_fp8_scale(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: upstream's ``_fp8_scale(amax)`` (amax / 448), rounded up to a power of two."""

    @functools.wraps(original)
    def _fp8_scale(amax: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return power_of_two_scale(original(amax, *args, **kwargs))

    return _fp8_scale
