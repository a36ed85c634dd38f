"""A pure-torch Fast Walsh-Hadamard transform for Megatron's DSA indexer when ``fast_hadamard_transform``
is missing.

``megatron/core/transformer/experimental_attention_variant/dsa.py`` (0.16-0.19) binds
``hadamard_transform`` from the CUDA-only ``fast_hadamard_transform`` package at import and binds
``None`` when that import fails; ``rotate_activation`` asserts the binding is not None. The
replacement keeps the package's contract (``hadamard_transform(x, scale=1.0)`` in
``fast_hadamard_transform_interface.py``, 1.1.0, and its kernel in ``csrc/fast_hadamard_transform.cpp``):

* the result is ``x @ H * scale`` along the last dimension, ``H`` the Sylvester Hadamard matrix
  (``scipy.linalg.hadamard``), computed in float32 and cast back to the input's dtype, as the kernel
  loads, transforms and stores;
* a last dimension that is not a power of two is zero-padded to the next power of two and the
  result cut back to the input's width (the kernel pads to a multiple of 8 and its butterflies run
  over the next power of two; the package's reference does exactly this);
* what the kernel refuses (a dtype other than float32, float16, bfloat16; a last dimension above
  32768) raises :class:`~patchkit.patches.megatron._errors.HadamardInputError`, so code that runs on the
  fallback runs on the kernel too;
* it is differentiable: torch's autograd gives the kernel's backward, the same transform of the
  gradient (``H`` is symmetric).
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from .._errors import HadamardInputError

logger = logging.getLogger(__name__)

#: The dtypes and the widest last dimension ``fast_hadamard_transform``'s kernel accepts.
KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_MAX_DIM = 32768

HadamardTransform = Callable[..., torch.Tensor]


def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``x`` times the Sylvester Hadamard matrix along its last dimension, times ``scale``.

    Same signature and result as ``fast_hadamard_transform.hadamard_transform`` (module docstring):
    float32 butterflies, zero padding to the next power of two, the input's shape and dtype back.
    """
    width = x.shape[-1] if x.dim() else 0
    if x.dtype not in KERNEL_DTYPES:
        raise HadamardInputError(tuple(x.shape), x.dtype, "the dtype is not float32, float16 or bfloat16")
    if not 1 <= width <= KERNEL_MAX_DIM:
        raise HadamardInputError(tuple(x.shape), x.dtype, f"the last dimension is {width}")
    padded = 1 << (width - 1).bit_length()
    values = x.to(torch.float32)
    if padded != width:
        values = torch.nn.functional.pad(values, (0, padded - width))
    # Butterfly of span `half`: each block of 2*half entries (a, b) becomes (a + b, a - b). Spans
    # 1, 2, 4, ... in turn multiply by the Sylvester matrix, in scipy's row order.
    half = 1
    while half < padded:
        blocks = values.unflatten(-1, (padded // (2 * half), 2, half))
        first, second = blocks.unbind(-2)
        values = torch.stack((first + second, first - second), dim=-2).flatten(-3)
        half *= 2
    values = values * scale
    if padded != width:
        values = values[..., :width]
    return values.to(x.dtype)


def fallback_when_missing(original: Optional[HadamardTransform]) -> HadamardTransform:
    """Wrap factory for ``dsa.hadamard_transform``: the module's own binding when the real package
    imported (the patch then changes nothing), :func:`hadamard_transform` when it is ``None``."""
    if original is not None:
        logger.debug("patchkit: megatron DSA uses fast_hadamard_transform as installed; binding kept")
        return original
    logger.warning(
        "patchkit: fast_hadamard_transform is not importable; Megatron's DSA indexer uses a pure-torch "
        "Hadamard transform (same results, slower than the CUDA kernel)"
    )
    return hadamard_transform
