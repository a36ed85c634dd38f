"""Wraps for the recorded quant methods' ``create_weights`` and ``process_weights_after_loading``.

One pair of factories for every refit patch that records layers: ``vllm.nvfp4_refit`` (ModelOpt NVFP4,
``vllm/model_executor/layers/quantization/modelopt.py``: ``ModelOptNvFp4LinearMethod``,
``ModelOptNvFp4W4A16LinearMethod`` (0.21-0.29), ``ModelOptLinearMethod`` (0.30+) and
``ModelOptNvFp4FusedMoE``) and ``vllm.fp8_refit`` (``quantization/fp8.py``: ``Fp8LinearMethod`` and
``Fp8MoEMethod``). Each declaration wraps both methods of each class it records with these two.
Upstream registers checkpoint-format vLLM parameters in ``create_weights`` and converts them in
``process_weights_after_loading``, replacing ``Parameter`` objects (dropping ``weight_loader``) and
deleting or rebinding checkpoint tensors (NVFP4 from 0.16: ``input_scale``/``weight_scale_2``; FP8:
requantised, transposed). Nothing in either method changes here. What is added:

- after ``create_weights``: the names of the parameters it registered are kept on the layer;
- around a layer's first ``process_weights_after_loading`` (after a real load or a dummy start,
  alike): those checkpoint parameters going in and the kernel tensors coming out are recorded for
  ``_refit_impl``, whatever the format. What a refit must supply is every such parameter in full,
  except placeholders the method never reads (``_refit_placeholders``). Later calls (the refit's own
  re-processing) pass straight through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ._refit_placeholders import unread_placeholders
from ._refit_state import (
    CREATED_ATTR,
    STATE_ATTR,
    KernelTensors,
    LayerRefitState,
    capture_checkpoint_specs,
    capture_method_state,
)

logger = logging.getLogger(__name__)


def wrap_create_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: remember which parameters ``create_weights`` registered."""

    @functools.wraps(original)
    def create_weights(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        existing = set(layer._parameters)
        result = original(self, layer, *args, **kwargs)
        created = frozenset(n for n, p in layer._parameters.items() if n not in existing and p is not None)
        object.__setattr__(layer, CREATED_ATTR, created)
        return result

    return create_weights


def wrap_process_weights_after_loading(
    original: Callable[..., Any],
    checkpoint_shapes: Callable[[Any, torch.nn.Module], Mapping[str, tuple[int, ...]]] | None = None,
) -> Callable[..., Any]:
    """Factory for ``Wrap``: record refit metadata around the first processing of a layer.

    ``checkpoint_shapes(method, layer)``, for a format whose layers vLLM may pad (MXFP4 MoE), gives the
    checkpoint's shape of each padded parameter (``ParamSpec.checkpoint_shape``).
    """

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if layer.__dict__.get(STATE_ATTR) is not None:
            return original(self, layer, *args, **kwargs)
        created = layer.__dict__.pop(CREATED_ATTR, None)
        shapes = checkpoint_shapes(self, layer) if checkpoint_shapes is not None else None
        checkpoint = capture_checkpoint_specs(layer, created, unread_placeholders(self), shapes)
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
