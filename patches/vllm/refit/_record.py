"""The recording pair every refit patch installs: wraps of a quant method's ``create_weights`` and
``process_weights_after_loading``, driven by the format table (``_formats.FORMATS``).

Each refit patch wraps both methods of each class it records with these two, whatever the format
(ModelOpt NVFP4, FP8, compressed-tensors NVFP4, ModelOpt MXFP8, MXFP4). Upstream registers
checkpoint-format vLLM parameters in ``create_weights`` and converts them in
``process_weights_after_loading``, replacing ``Parameter`` objects (dropping ``weight_loader``) and
deleting or rebinding checkpoint tensors. Nothing in either method changes here. What is added, for a
layer of a format in the table (found from the method and, for compressed-tensors linear layers, the
scheme on ``layer.scheme``; any other layer goes straight to upstream, unrecorded, and a refit refuses
it):

- after ``create_weights``: the names of the parameters it registered are kept on the layer;
- around a layer's first ``process_weights_after_loading`` (after a real load or a dummy start,
  alike), when its row says a refit can take it (``unrefittable``): those checkpoint parameters going
  in (the checkpoint's shape of each one vLLM padded: the row's ``checkpoint_shapes``) and the kernel
  tensors coming out (with the row's ``served_tensors``: what the kernel reads besides the layer's
  tensors) are recorded for ``_impl``, with the kernel backend the row's ``backend`` names. What a
  refit must supply is every such parameter in full, except placeholders the method never reads (``_placeholders``);
- a refit's own re-processing runs the row's ``before_reprocessing`` while checkpoint parameters are
  staged, then upstream's method; any other later call passes straight through.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from ._formats import backend, format_of, matching_format, served_tensors
from ._placeholders import unread_placeholders
from ._state import (
    CREATED_ATTR,
    STATE_ATTR,
    KernelTensors,
    LayerRefitState,
    capture_checkpoint_specs,
    capture_method_state,
)

logger = logging.getLogger(__name__)


def wrap_create_weights(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: remember which parameters ``create_weights`` registered on a layer of a
    refit format."""

    @functools.wraps(original)
    def create_weights(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if matching_format(self, layer) is None:
            return original(self, layer, *args, **kwargs)
        existing = set(layer._parameters)
        result = original(self, layer, *args, **kwargs)
        created = frozenset(n for n, p in layer._parameters.items() if n not in existing and p is not None)
        object.__setattr__(layer, CREATED_ATTR, created)
        return result

    return create_weights


def wrap_process_weights_after_loading(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: record refit metadata around the first processing of a layer a refit can
    take; before a refit's own processing, run its format's ``before_reprocessing``."""

    @functools.wraps(original)
    def process_weights_after_loading(self: Any, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        state = layer.__dict__.get(STATE_ATTR)
        if state is not None:
            fmt = matching_format(self, layer)
            if state.staging is not None and fmt is not None and fmt.before_reprocessing is not None:
                fmt.before_reprocessing(layer)
            return original(self, layer, *args, **kwargs)
        created = layer.__dict__.pop(CREATED_ATTR, None)
        fmt = format_of(self, layer)
        if fmt is None:
            return original(self, layer, *args, **kwargs)
        shapes = fmt.checkpoint_shapes(self, layer) if fmt.checkpoint_shapes is not None else None
        checkpoint = capture_checkpoint_specs(layer, created, unread_placeholders(self), shapes)
        result = original(self, layer, *args, **kwargs)
        state = LayerRefitState(
            checkpoint=checkpoint,
            kernel=KernelTensors.of(layer, served_tensors(self, layer), checkpoint),
            method_state=capture_method_state(self),
            backend=backend(self, layer),
        )
        object.__setattr__(layer, STATE_ATTR, state)
        logger.debug("recorded %d checkpoint parameters of %s for refit%s", len(checkpoint), type(layer).__name__,
                     f" (backend {state.backend})" if state.backend else "")
        return result

    return process_weights_after_loading
