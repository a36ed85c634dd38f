"""Public refit API: push new checkpoint-format weights into a live vLLM model.

One call sequence works on every vLLM version patchkit supports::

    from patchkit.patches.vllm import refit

    with refit.refit(model):                 # or prepare_refit(model) ... finish_refit(model)
        model.load_weights(weights)          # vLLM's own loader, the checkpoint's own format

    refit.refit_weights(model, weights)      # the same in one call; loader errors become RefitError

``weights`` are in the format of the checkpoint the model was started from: ModelOpt NVFP4 (packed
``weight``, ``weight_scale``, ``weight_scale_2``, ``input_scale``), FP8-serialised (E4M3
``weight`` with ``weight_scale``/``input_scale``, or ``weight_scale_inv`` per block) or ModelOpt MXFP8
(E4M3 ``weight``, E8M0 ``weight_scale`` per 32 inputs), plus whatever
unquantized tensors the model has. The model may have been started with ``load_format="dummy"`` (as
verl and NeMo-RL do): what a refit must supply is read from the parameters each layer's
``create_weights`` registered, not from what a first load wrote.

Layers are recorded at their first ``process_weights_after_loading`` by the patch of their format:
``vllm.nvfp4_refit`` (ModelOpt NVFP4 linear and fused-MoE layers, vLLM 0.12-0.33) and
``vllm.fp8_refit`` (``Fp8LinearMethod``/``Fp8MoEMethod``, per-tensor and block-wise, vLLM 0.24-0.33),
``vllm.mxfp8_refit`` (``ModelOptMxFp8LinearMethod`` 0.24-0.29, ``ModelOptMxFp8FusedMoE`` 0.24-0.33).
For every recorded layer patchkit stages fresh checkpoint-format parameters (same vLLM class, same
weight loaders), re-runs upstream's ``process_weights_after_loading`` on them and copies the result
into the kernel tensors captured at first load, so CUDA graphs keep valid addresses. Unquantized
tensors are written in place by vLLM's loaders and copied aside first. KV-cache scales
(``k_scale``/``v_scale``/``q_scale``/``prob_scale``) may be part of the stream; when they are absent
the scales in use are kept. No vLLM range is declared ``native`` yet (see ``nvfp4_refit.py`` and
``fp8_refit.py``); a version reported native would get its backend here, behind the same calls.
docs/vllm-refit.md tells the whole story.

Errors are :class:`RefitError` and leave every layer serving the weights it served before. A model
with a layer of a quantization method patchkit cannot refit (anything but unquantized layers, KV-cache
scales and the recorded ModelOpt NVFP4, FP8, compressed-tensors NVFP4, ModelOpt MXFP8 and MXFP4-on-Marlin
MoE methods)
is refused whole, before any write, with :class:`UnsupportedQuantizationError` naming the layer and its
method. Refit tensors go to vLLM's loaders on whatever device they are (their ``copy_`` moves them onto
the parameter's); one on the ``meta`` device holds no data and is refused with :class:`RefitDeviceError`
before its loader runs.
Each call claims the model: a second thread refitting the same model meanwhile gets
:class:`RefitInProgressError` at once. SIGINT and SIGTERM (with a Python handler) are held while a
call changes the model and delivered once it is consistent: an interrupted refit leaves the model
serving its previous weights, or, once the final copies began, the new ones; never half of each.

The work lives in ``_refit_impl``, imported on first use, so importing this module stays light.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from ._constants import NVFP4_REFIT_PATCH_ID
from ._errors import RefitDeviceError, RefitError, RefitInProgressError, UnsupportedQuantizationError

__all__ = [
    "RefitError", "RefitInProgressError", "UnsupportedQuantizationError", "RefitDeviceError", "prepare_refit",
    "finish_refit", "abort_refit", "refit", "refit_weights", "refit_mode",
]

#: ModelOpt NVFP4's refit patch, the one ``refit_mode`` names first when no refit patch is installed
#: (every format's patch is named in docs/vllm-refit.md).
PATCH_ID = NVFP4_REFIT_PATCH_ID


def refit_mode() -> str:
    """How refits run in this process: ``"patchkit"`` (no vLLM range is declared native yet).

    Raises :class:`RefitError` when no refit patch (``vllm.nvfp4_refit``, ``vllm.fp8_refit``, ...) is
    installed (not applied, vLLM version outside the verified ranges, or switched off), naming the
    state of ``vllm.nvfp4_refit`` and why.
    """
    from ._refit_mode import current_mode

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
    from . import _refit_impl

    return _refit_impl
