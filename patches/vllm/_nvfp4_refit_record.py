"""Wraps for the ModelOpt NVFP4 methods' ``create_weights`` and ``process_weights_after_loading``.

Upstream (``vllm/model_executor/layers/quantization/modelopt.py``: ``ModelOptNvFp4LinearMethod``,
``ModelOptNvFp4W4A16LinearMethod`` (0.21-0.29), ``ModelOptLinearMethod`` (0.30+) and
``ModelOptNvFp4FusedMoE``) registers checkpoint-format vLLM parameters in ``create_weights`` and
converts them in ``process_weights_after_loading``, replacing ``Parameter`` objects (dropping
``weight_loader``) and, from 0.16, deleting ``input_scale``/``weight_scale_2``. Nothing in either
method changes here. What is added:

- after ``create_weights``: the new parameters' loaders count what the model's original load
  writes, so a refit can require the same (a W4A16 checkpoint leaves the ``input_scale``
  placeholder unloaded; a refit must not demand it);
- around a layer's first ``process_weights_after_loading``: the counting loaders are removed, and
  the checkpoint parameters going in and the kernel tensors coming out are recorded for
  ``_refit_impl``. Later calls (the refit's own re-processing) pass straight through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from ._refit_loaders import unwrap_counting_loader, wrap_counting_loader
from ._refit_state import (
    FIRST_LOAD_ATTR,
    STATE_ATTR,
    UNPROCESSED_PARAMS,
    KernelTensors,
    LayerRefitState,
    LoadLog,
    capture_checkpoint_specs,
    capture_method_state,
)

logger = logging.getLogger(__name__)


def wrap_create_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: count what the original load writes into the new parameters."""

    @functools.wraps(original)
    def create_weights(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        existing = set(layer._parameters)
        result = original(self, layer, *args, **kwargs)
        log = LoadLog()
        for name, param in layer._parameters.items():
            if name not in existing and name not in UNPROCESSED_PARAMS and param is not None:
                wrap_counting_loader(param, name, log)
        object.__setattr__(layer, FIRST_LOAD_ATTR, log)
        return result

    return create_weights


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record refit metadata around the first processing of a layer."""

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if layer.__dict__.get(STATE_ATTR) is not None:
            return original(self, layer, *args, **kwargs)
        first_load = layer.__dict__.pop(FIRST_LOAD_ATTR, None)
        for param in layer._parameters.values():
            if param is not None:
                unwrap_counting_loader(param)
        checkpoint = capture_checkpoint_specs(layer, first_load)
        result = original(self, layer, *args, **kwargs)
        object.__setattr__(
            layer,
            STATE_ATTR,
            LayerRefitState(
                checkpoint=checkpoint,
                kernel=KernelTensors.of(layer),
                method_state=capture_method_state(self),
            ),
        )
        logger.debug("recorded %d checkpoint parameters of %s for refit", len(checkpoint), type(layer).__name__)
        return result

    return process_weights_after_loading
