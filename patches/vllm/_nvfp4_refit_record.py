"""Wrap for the ModelOpt NVFP4 methods' ``process_weights_after_loading`` (vLLM 0.12-0.29).

Upstream (``vllm/model_executor/layers/quantization/modelopt.py``,
``ModelOptNvFp4LinearMethod``, ``ModelOptNvFp4W4A16LinearMethod`` (0.21-0.29) and
``ModelOptNvFp4FusedMoE``) converts the checkpoint parameters that ``create_weights`` registered
into kernel format: it replaces ``Parameter`` objects (dropping ``weight_loader``) and, from 0.16,
deletes ``input_scale``/``weight_scale_2``. What changes here: nothing in the conversion itself;
the wrap records, on a layer's first processing only, the checkpoint parameters going in and the
kernel tensors coming out, which is what ``_refit_impl`` needs to reload the layer later. Later
calls (the refit's own re-processing) pass straight through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from ._refit_state import (
    STATE_ATTR,
    KernelTensors,
    LayerRefitState,
    capture_checkpoint_specs,
    capture_method_state,
)

logger = logging.getLogger(__name__)


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record refit metadata around the first processing of a layer."""

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if getattr(layer, STATE_ATTR, None) is not None:
            return original(self, layer, *args, **kwargs)
        checkpoint = capture_checkpoint_specs(layer)
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
        logger.debug(
            "recorded %d checkpoint parameters of %s for refit",
            len(checkpoint),
            type(layer).__name__,
        )
        return result

    return process_weights_after_loading
