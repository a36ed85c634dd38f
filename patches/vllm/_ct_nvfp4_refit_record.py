"""Wraps for ``CompressedTensorsLinearMethod.create_weights``/``process_weights_after_loading`` that
record a layer for refit when its scheme is compressed-tensors NVFP4.

Upstream (``quantization/compressed_tensors/compressed_tensors.py``) serves every compressed-tensors
scheme through this one linear method: ``get_quant_method`` sets ``layer.scheme`` before the layer's
``create_weights`` runs, and both methods delegate to the scheme. Only an NVFP4 scheme
(``_ct_nvfp4_targets``) is recorded, with the wraps ``vllm.nvfp4_refit`` uses (``_refit_record``);
every other layer goes straight to upstream, unrecorded, so a refit refuses it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from . import _refit_record
from ._ct_nvfp4_targets import is_nvfp4_linear


def wrap_create_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: ``_refit_record.wrap_create_weights`` for NVFP4 layers only."""
    return _for_nvfp4_layers(original, _refit_record.wrap_create_weights(original))


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: ``_refit_record.wrap_process_weights_after_loading`` for NVFP4 layers only."""
    return _for_nvfp4_layers(original, _refit_record.wrap_process_weights_after_loading(original))


def _for_nvfp4_layers(original: Callable[..., Any], recording: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if is_nvfp4_linear(layer):
            return recording(self, layer, *args, **kwargs)
        return original(self, layer, *args, **kwargs)

    return method
