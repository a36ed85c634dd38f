"""Megatron's own ``rotate_activation`` (the DSA indexer's Hadamard rotation) and what it must return.

What the ``megatron.dsa_hadamard_fallback`` check and its tests share. The expected rotation is
built independently of the transform under test: the Sylvester Hadamard matrix (``H_1 = [1]``,
``H_2n = [[H_n, H_n], [H_n, -H_n]]``, the matrix ``scipy.linalg.hadamard`` returns) as a dense
float64 matrix product, with the zero padding to the next power of two that
``fast_hadamard_transform``'s reference applies.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch


@dataclasses.dataclass(frozen=True)
class Rotation:
    """What upstream's ``rotate_activation`` did with one input: its result, or the error it raised."""

    result: Optional[torch.Tensor]
    error: Optional[str]


def sylvester_hadamard(order: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix of ``order`` (a power of two), float64, by Kronecker products."""
    if order < 1 or order & (order - 1):
        raise ValueError(f"a Sylvester Hadamard matrix has a power-of-two order, not {order}")
    matrix = torch.ones(1, 1, dtype=torch.float64)
    step = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    while matrix.shape[0] < order:
        matrix = torch.kron(step, matrix)
    return matrix


def expected_transform(x: torch.Tensor, scale: float, matrix: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``x @ H * scale`` along the last dimension in float64 (zero-padded to a power of two, cut back),
    cast to ``x``'s dtype. ``matrix`` is ``H`` of the padded order when the caller has its own."""
    width = x.shape[-1]
    order = 1 << (width - 1).bit_length()
    if matrix is None:
        matrix = sylvester_hadamard(order)
    values = torch.nn.functional.pad(x.to(torch.float64), (0, order - width))
    return ((values @ matrix.to(values.device)) * scale)[..., :width].to(x.dtype)


def upstream_rotation(x: torch.Tensor) -> Rotation:
    """Run megatron-core's ``dsa.rotate_activation`` on ``x`` as the module is now."""
    from megatron.core.transformer.experimental_attention_variant.dsa import rotate_activation

    try:
        return Rotation(rotate_activation(x), None)
    except Exception as exc:  # upstream's assert is what the patch exists for: report it, not raise it
        return Rotation(None, f"{type(exc).__name__}: {exc}")


def expected_rotation(x: torch.Tensor) -> torch.Tensor:
    """What ``rotate_activation`` computes with the real package: ``H x / sqrt(d)`` along the last dim."""
    return expected_transform(x, x.shape[-1] ** -0.5)


def rounding_excess(found: torch.Tensor, expected: torch.Tensor, x: torch.Tensor, scale: float) -> float:
    """Largest ``|found - expected|`` as a fraction of what computing in float32 and storing in
    ``expected``'s dtype may cost: one unit in the last place of the dtype at ``expected``'s magnitude,
    plus float32 rounding over the ``log2(order)`` butterfly levels of ``sum |x| * |scale|``.
    At most 1 when ``found`` is right."""
    order = 1 << (x.shape[-1] - 1).bit_length()
    levels = max(order.bit_length() - 1, 1)
    reference = expected.to(torch.float64)
    magnitude = x.to(torch.float64).abs().sum(dim=-1, keepdim=True) * abs(scale)
    allowed = (torch.finfo(expected.dtype).eps * reference.abs()
               + levels * torch.finfo(torch.float32).eps * magnitude
               + torch.finfo(expected.dtype).tiny)
    return float(((found.to(torch.float64) - reference).abs() / allowed).max())
