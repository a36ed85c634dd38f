"""The one driver of every refit self-check, and the comparisons its cases share.

A case (one per refit format, in ``_checks/<patch>.py``) starts vLLM's own layers of its format with a
first checkpoint and hands :func:`refit_steps` the checkpoints to refit in turn and how to verify
each; the driver refits each through ``patchkit.patches.vllm.refit`` and proves, after every step,
what the case verifies and that the layers keep their kernel tensors (same objects, same storage,
which CUDA graphs and the engine hold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from patchkit.selfcheck import SelfCheckFailed, expect

#: (what the step does, the checkpoint it refits)
Step = tuple[str, dict[str, torch.Tensor]]
KernelBytes = dict[str, tuple[torch.Size, torch.dtype, torch.Tensor]]


def refit_steps(
    model: Any,
    what: str,
    steps: Iterable[Step],
    load: Callable[[dict[str, torch.Tensor]], None],
    verify: Callable[[str, dict[str, torch.Tensor]], None],
    identities: Callable[[Any], dict[str, tuple[int, int]]] | None = None,
    takes: str = "the layers take the new weights",
) -> None:
    """Refit ``model`` (``what``: its layers, for messages) with each step's checkpoint, loaded by
    ``load`` inside ``refit(model)``; after each, ``verify(step, checkpoint)`` and check that no kernel
    tensor was replaced (``identities``: every parameter and buffer by default). A refit that raises
    fails the check as ``takes`` not holding."""
    from .._api import refit

    identities_of = identities or kernel_identities
    before = identities_of(model)
    for step, weights in steps:
        try:
            with refit(model):
                load(weights)
        except Exception as exc:
            raise SelfCheckFailed(f"{step} of {what}", takes, _first_line(exc)) from exc
        verify(step, weights)
        moved = sorted(name for name, now in identities_of(model).items() if before.get(name) != now)
        expect(not moved, f"the {step} of {what} keeps every kernel tensor (same object, same storage)",
               "none replaced", moved)


def kernel_tensors(model: torch.nn.Module, buffers: bool = True) -> dict[str, torch.Tensor]:
    """Every parameter and (``buffers``) buffer of ``model``, by name."""
    return {**dict(model.named_parameters()), **(dict(model.named_buffers()) if buffers else {})}


def kernel_identities(model: torch.nn.Module, buffers: bool = True) -> dict[str, tuple[int, int]]:
    """Every parameter and (``buffers``) buffer: object id and data pointer."""
    return {name: (id(t), t.data_ptr()) for name, t in kernel_tensors(model, buffers).items()}


def kernel_bytes(model: torch.nn.Module, buffers: bool = True) -> KernelBytes:
    """Every parameter and (``buffers``) buffer: shape, dtype and bytes (bit-exact comparison, NaN included)."""
    return {name: (t.shape, t.dtype, t.detach().reshape(-1).view(torch.uint8).cpu().clone())
            for name, t in kernel_tensors(model, buffers).items()}


def differing(model: torch.nn.Module, reference: KernelBytes, buffers: bool = True) -> list[str]:
    """The tensors of ``model`` that differ from ``reference`` (:func:`kernel_bytes`) in shape, dtype or a bit."""
    ours = kernel_bytes(model, buffers)
    names = sorted(ours.keys() | reference.keys())
    return [n for n in names if n not in ours or n not in reference or ours[n][:2] != reference[n][:2]
            or not torch.equal(ours[n][2], reference[n][2])]


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
