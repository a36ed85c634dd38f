"""Public refit API: push new checkpoint-format weights into a live vLLM model.

One call sequence works on every vLLM version patchkit supports::

    from patchkit.patches.vllm import refit

    with refit.refit(model):                 # or prepare_refit(model) ... finish_refit(model)
        model.load_weights(weights)          # vLLM's own loader, the checkpoint's own format

    refit.refit_weights(model, weights)      # the same in one call; loader errors become RefitError

``weights`` are in the format of the checkpoint the model was started from: ModelOpt NVFP4 (packed
``weight``, ``weight_scale``, ``weight_scale_2``, ``input_scale``), FP8-serialised (E4M3
``weight`` with ``weight_scale``/``input_scale``, or ``weight_scale_inv`` per block) or ModelOpt MXFP8
(E4M3 ``weight``, E8M0 ``weight_scale`` per 32 inputs), or bf16 for the layers vLLM quantised to FP8 at
load (online FP8, per tensor: vLLM's own processing quantises them again), plus whatever
unquantized tensors the model has. The model may have been started with ``load_format="dummy"`` (as
verl and NeMo-RL do): what a refit must supply is read from the parameters each layer's
``create_weights`` registered, not from what a first load wrote.

Layers are recorded at their first ``process_weights_after_loading`` by the patch of their format:
``vllm.nvfp4_refit`` (ModelOpt NVFP4 linear and fused-MoE layers, vLLM 0.12-0.33) and
``vllm.fp8_refit`` (``Fp8LinearMethod``/``Fp8MoEMethod``, per-tensor and block-wise, vLLM 0.24-0.33),
``vllm.mxfp8_refit`` (``ModelOptMxFp8LinearMethod`` 0.24-0.29, ``ModelOptMxFp8FusedMoE`` 0.24-0.33),
``vllm.fp8_online_refit`` (online per-tensor FP8, 0.24-0.33) and the other formats of ``_formats``.
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

This package is the family of every refit format: the API below (``_api``), the format table
(``_formats``), the recording pair every refit patch installs (``_record``), the staging, checks and
commit (``_impl``, ``_commit``), each format's declaration (``<format>_refit.py``) and the self-check
driver with a case per format (``_checks/``). docs/vllm-refit.md ("Adding a format") shows what a new
format costs. The functions are imported on first use (PEP 562), and the work lives in ``_impl``, so
importing this package, as the catalogue does for its declarations, imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._constants import NVFP4_REFIT_PATCH_ID as PATCH_ID
from .._errors import RefitDeviceError, RefitError, RefitInProgressError, UnsupportedQuantizationError

if TYPE_CHECKING:
    from ._api import abort_refit, finish_refit, prepare_refit, refit, refit_mode, refit_weights

#: Imported on first use; the errors and ``PATCH_ID`` above (ModelOpt NVFP4's refit patch, the one
#: ``refit_mode`` names first when no refit patch is installed) are bound now.
_EXPORTS = dict.fromkeys(("abort_refit", "finish_refit", "prepare_refit", "refit", "refit_mode", "refit_weights"),
                         "._api")
__all__ = [
    "PATCH_ID", "RefitDeviceError", "RefitError", "RefitInProgressError", "UnsupportedQuantizationError",
    "abort_refit", "finish_refit", "prepare_refit", "refit", "refit_mode", "refit_weights",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
