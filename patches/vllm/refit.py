"""Public refit API: push new checkpoint-format weights into a live vLLM model.

One call sequence works on every vLLM version patchkit supports::

    from patchkit.patches.vllm import refit

    with refit.refit(model):                 # or prepare_refit(model) ... finish_refit(model)
        model.load_weights(weights)          # vLLM's own loader, checkpoint (ModelOpt) format

On versions where patchkit's ``vllm.nvfp4_refit`` patch is applied, patchkit stages fresh
checkpoint-format parameters (same vLLM class, same weight loaders) for every recorded ModelOpt
NVFP4 layer, re-runs upstream's ``process_weights_after_loading`` on them and copies the result
into the kernel tensors captured at first load, so CUDA graphs keep valid addresses. KV-cache
scales (``k_scale``/``v_scale``/``q_scale``/``prob_scale``) may be part of the stream; when they
are absent the scales in use are kept. No vLLM range is declared ``native`` yet (see
``nvfp4_refit.py``); a version reported native would get its backend here, behind the same calls.

Errors are :class:`RefitError` and leave every layer serving the weights it served before.

This module is also scanned by the engine as a declaration module, so it stays import-light: the
work lives in ``_refit_impl``, imported on first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["RefitError", "prepare_refit", "finish_refit", "abort_refit", "refit", "refit_mode"]

# Data-only module for the engine: the refit API declares no patch of its own.
PATCHES: tuple = ()

PATCH_ID = "vllm.nvfp4_refit"


class RefitError(ValueError):
    """A refit could not be applied; the model still serves its previous weights.

    ``layer`` and ``parameter`` name what failed (``None`` when the failure is model-wide);
    ``expected`` and ``got`` describe the parameter and the refit tensor (shape and dtype) when the
    failure is about a tensor.
    """

    def __init__(
        self,
        message: str,
        *,
        layer: str | None = None,
        parameter: str | None = None,
        expected: str | None = None,
        got: str | None = None,
    ) -> None:
        super().__init__(message)
        self.layer = layer
        self.parameter = parameter
        self.expected = expected
        self.got = got


def refit_mode() -> str:
    """How refits run in this process: ``"patchkit"`` (the only backend so far).

    Raises :class:`RefitError` when neither is available (patch not applied, vLLM version outside
    the verified ranges, or the patch switched off), naming the patch state and reason.
    """
    from ._refit_mode import current_mode

    return current_mode()


def prepare_refit(model: torch.nn.Module) -> None:
    """Make ``model`` ready for ``model.load_weights`` with checkpoint-format tensors.

    Until :func:`finish_refit` or :func:`abort_refit`, the refitted layers must not run forward.
    """
    _backend().prepare(model)


def finish_refit(model: torch.nn.Module) -> None:
    """Convert the loaded tensors to kernel format in place; all-or-nothing.

    On any error the model is rolled back to its previous weights and :class:`RefitError` is raised.
    """
    _backend().finish(model)


def abort_refit(model: torch.nn.Module) -> None:
    """Drop a prepared refit and put the previous kernel tensors back (no-op if none prepared)."""
    _backend().abort(model)


@contextlib.contextmanager
def refit(model: torch.nn.Module) -> Iterator[None]:
    """``prepare_refit`` on entry, ``finish_refit`` on normal exit, ``abort_refit`` on error."""
    backend = _backend()
    backend.prepare(model)
    try:
        yield
    except BaseException:
        backend.abort(model)
        raise
    backend.finish(model)


def _backend() -> Any:
    refit_mode()  # raises RefitError when the patch is not installed
    from . import _refit_impl

    return _refit_impl
