"""What the per-format refit tests share: refits that alternate checkpoints and calls, and ways to spoil
one tensor of a checkpoint.

:func:`refit_alternately` is the body of each format's ``test_refits_equal_vllms_first_load_*``. A spoil
(:func:`halved`, :func:`retyped`, :func:`dropped`, :func:`first_byte_set`) changes, in place, the last
tensor of a checkpoint whose name ends with a suffix (or passes a test), and returns that name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from nvfp4_helpers import items
from patchkit.patches.vllm.refit import refit, refit_weights

Checkpoint = dict[str, torch.Tensor]
Spoil = Callable[[Checkpoint], str]


def refit_alternately(
    model: Any,
    checkpoints: Sequence[Checkpoint],
    steps: int,
    served_as_first_load: Callable[[Checkpoint], None],
    identities: Callable[[Any], object],
) -> None:
    """Refit ``model`` ``steps`` times with the checkpoints in turn, through ``refit(model)`` around
    ``model.load_weights`` and ``refit_weights`` in turn; after each, ``served_as_first_load(checkpoint)``
    asserts what the model serves, and ``identities(model)`` must not have changed."""
    before = identities(model)
    for step in range(steps):
        checkpoint = checkpoints[step % len(checkpoints)]
        if step % 2:
            refit_weights(model, items(checkpoint))
        else:
            with refit(model):
                model.load_weights(items(checkpoint))
        served_as_first_load(checkpoint)
        assert identities(model) == before


def _last(checkpoint: Checkpoint, match: str | Callable[[str], bool]) -> str:
    matches = match if callable(match) else (lambda name: name.endswith(match))
    return next(name for name in reversed(checkpoint) if matches(name))


def halved(match: str | Callable[[str], bool], dim: int) -> Spoil:
    """The tensor cut to half its size along ``dim``."""

    def spoil(checkpoint: Checkpoint) -> str:
        name = _last(checkpoint, match)
        tensor = checkpoint[name]
        checkpoint[name] = tensor.narrow(dim, 0, tensor.shape[dim] // 2).contiguous()
        return name

    return spoil


def retyped(match: str | Callable[[str], bool], dtype: torch.dtype) -> Spoil:
    """The tensor converted to ``dtype``."""

    def spoil(checkpoint: Checkpoint) -> str:
        name = _last(checkpoint, match)
        checkpoint[name] = checkpoint[name].to(dtype)
        return name

    return spoil


def dropped(match: str | Callable[[str], bool]) -> Spoil:
    """The tensor left out."""

    def spoil(checkpoint: Checkpoint) -> str:
        name = _last(checkpoint, match)
        del checkpoint[name]
        return name

    return spoil


def first_byte_set(match: str | Callable[[str], bool], value: int) -> Spoil:
    """The tensor's first byte set to ``value`` (a NaN bit pattern of its format)."""

    def spoil(checkpoint: Checkpoint) -> str:
        name = _last(checkpoint, match)
        checkpoint[name].view(torch.uint8).view(-1)[0] = value
        return name

    return spoil


def pointers(model: torch.nn.Module) -> dict[str, int]:
    """Every kernel tensor's data pointer, by name (``nvfp4_helpers.kernel_state``)."""
    from nvfp4_helpers import kernel_state

    return {name: ptr for name, (ptr, _) in kernel_state(model).items()}
