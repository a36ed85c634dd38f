"""The refit API's functions (``patchkit.patches.vllm.refit`` exports them; its docstring tells the
whole story). Each call checks that a refit patch is installed, then hands the work to ``_impl``,
imported on first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def refit_mode() -> str:
    """How refits run in this process: ``"patchkit"`` (no vLLM range is declared native yet).

    Raises :class:`RefitError` when no refit patch (``vllm.nvfp4_refit``, ``vllm.fp8_refit``, ...) is
    installed (not applied, vLLM version outside the verified ranges, or switched off), naming the
    state of ``vllm.nvfp4_refit`` and why.
    """
    from ._mode import current_mode

    return current_mode()


def prepare_refit(model: torch.nn.Module, *, allow_non_finite: bool = False) -> None:
    """Make ``model`` ready for ``model.load_weights`` with checkpoint-format tensors.

    ``allow_non_finite=True`` lets :func:`finish_refit` load NaN/Inf weights and scales, as vLLM does;
    by default they are refused (see :func:`refit_weights`).

    Until :func:`finish_refit` or :func:`abort_refit`, the refitted layers must not run forward.
    Raises :class:`RefitInProgressError` if a refit is already prepared or another call is running.
    A signal that arrives meanwhile is delivered as the call returns, after the model is prepared:
    whoever catches it must call :func:`abort_refit` (a no-op when nothing is prepared), as
    :func:`refit` and :func:`refit_weights` do.
    """
    _backend().prepare(model, allow_non_finite)


def finish_refit(model: torch.nn.Module) -> None:
    """Convert the loaded tensors to kernel format in place; all-or-nothing.

    On any error the model is rolled back to its previous weights and :class:`RefitError` is raised.
    """
    _backend().finish(model)


def abort_refit(model: torch.nn.Module) -> None:
    """Drop a prepared refit and put the previous kernel tensors back (no-op if none prepared)."""
    _backend().abort(model)


def refit(model: torch.nn.Module, *, allow_non_finite: bool = False) -> contextlib.AbstractContextManager[None]:
    """``prepare_refit`` on entry, ``finish_refit`` on normal exit, ``abort_refit`` on error.

    The model is claimed for the whole block: :func:`prepare_refit`, :func:`finish_refit` and
    :func:`abort_refit` on it inside the block raise :class:`RefitInProgressError`. A signal lands
    in the block as usual (then the refit is rolled back); one that arrives while patchkit prepares
    or finishes is held until the model is consistent.
    """
    return _backend().refitting(model, allow_non_finite)  # type: ignore[no-any-return]


def refit_weights(
    model: torch.nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    *,
    load_weights: Callable[[Iterable[tuple[str, torch.Tensor]]], Any] | None = None,
    allow_non_finite: bool = False,
) -> None:
    """One call for a whole refit: prepare, stream ``weights`` through vLLM's loaders, finish.

    ``weights`` are ``(name, tensor)`` pairs in the checkpoint's format (ModelOpt NVFP4 or FP8) under
    the model's checkpoint names, as ``model.load_weights`` takes them; they are consumed once, in order, so a
    generator that produces one layer at a time keeps peak memory at one layer. ``load_weights``
    defaults to ``model.load_weights`` (every vLLM model has one) or, for a bare module of vLLM
    layers, vLLM's ``AutoWeightsLoader``.

    All-or-nothing, after a real first load or a ``load_format="dummy"`` start alike: a tensor of
    the wrong shape or dtype (larger or smaller than the part of the parameter it fills), one on the
    ``meta`` device (:class:`RefitDeviceError`), a parameter or any part of one left out, a tensor
    sent twice (under its own name or another's: every element of every parameter must be written
    by exactly one refit tensor), or a name the model does not have raises :class:`RefitError`
    naming the layer and parameter, and every layer keeps its previous weights.

    NaN or infinity in a weight or scale of a quantized layer is refused the same way, in every
    format; ``allow_non_finite=True`` (or ``PATCHKIT_REFIT_ALLOW_NON_FINITE=1`` in the environment)
    loads them as vLLM would.
    """
    _backend().refit_weights(model, weights, load_weights, allow_non_finite)


def _backend() -> Any:
    refit_mode()  # raises RefitError when the patch is not installed
    from . import _impl

    return _impl
