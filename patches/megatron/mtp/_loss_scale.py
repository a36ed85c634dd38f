"""A per-forward factor on the MTP loss, set by the caller around the forward.

Under ``calculate_per_token_loss`` megatron-core's ``finalize_model_grads`` divides every gradient by
the token count the main loss reports; a trainer whose main loss is normalised another way (verl
divides by the routed tokens of the global batch) computes, per micro-batch, the factor that keeps
the MTP loss's weight right, and verl hands it over on ``packed_seq_params``. Here it is a context
around the forward: the MTP loss of every forward inside is scaled by ``mtp_loss_scaling_factor *
factor`` (on every release and whatever ``calculate_per_token_loss`` says; a caller that wants the
factor only under per-token loss passes it only then). Context-local, so threads and interleaved
pipeline schedules each see their own; the loss is scaled when the forward attaches it, so a
backward outside the context keeps it. Imports neither torch nor megatron.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator

from .._errors import MTPOptionError

_factor: contextvars.ContextVar[float] = contextvars.ContextVar("patchkit_mtp_loss_scale", default=1.0)


@contextlib.contextmanager
def loss_scale(factor: float) -> Iterator[float]:
    """Scale the MTP loss of the forwards run inside by ``factor`` (positive and finite)."""
    value = float(factor)
    if not math.isfinite(value) or value <= 0:
        raise MTPOptionError(f"loss_scale(factor) takes a positive finite number; got {factor!r}")
    token = _factor.set(value)
    try:
        yield value
    finally:
        _factor.reset(token)


def current_loss_scale() -> float:
    """The factor of the innermost :func:`loss_scale` (1.0 outside any)."""
    return _factor.get()
