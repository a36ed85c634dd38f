"""``MultiTokenPredictionLayer._checkpointed_forward`` that takes ``padding_mask`` (megatron-core 0.18).

0.18 added ``padding_mask`` to the MTP layer: ``forward`` passes it to ``_checkpointed_forward``,
which does not accept it, so any forward with ``recompute_granularity='full'`` and MTP raises
``TypeError: _checkpointed_forward() got an unexpected keyword argument 'padding_mask'`` (reproduced
on 0.18.2). 0.19 added the parameter and routes it positionally through the checkpoint.

What changes: with ``padding_mask`` None (what ``_proj_and_transformer_layer`` defaults to) the
original runs unchanged. With a mask, the uniform method checkpoints ``_proj_and_transformer_layer``
through ``tensor_parallel.checkpoint`` as 0.19 does (tensors and ``None`` positionally, the mask
among them; non-tensor arguments captured); the block method runs it without recompute, as
upstream's block branch does. Quantized recompute (fp8/fp4, TransformerEngine's checkpoint) with a
mask is refused with :class:`MTPRecomputeError`: 0.18 has no path for it; use 0.19+.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

from megatron.core import tensor_parallel
from torch import Tensor

from ..._errors import MTPRecomputeError


def _travels_through_checkpoint(value: Any) -> bool:
    return value is None or isinstance(value, Tensor)


def _recompute_with_padding_mask(layer: Any, padding_mask: Tensor, arguments: dict[str, Any]) -> Tensor:
    config = layer.config
    if config.fp8 or getattr(config, "fp4", None):
        raise MTPRecomputeError(
            "megatron-core 0.18 cannot recompute an MTP layer under fp8/fp4 with a padding_mask "
            f"(found fp8={config.fp8!r}, fp4={getattr(config, 'fp4', None)!r}); upgrade to 0.19+ "
            "or unset recompute_granularity for MTP."
        )
    if config.recompute_method == "block":
        warnings.warn("recompute_method == 'block' is not supported for MTP yet. Skipping recompute.", stacklevel=3)
        return layer._proj_and_transformer_layer(padding_mask=padding_mask, **arguments)
    if config.recompute_method != "uniform":
        raise ValueError("Invalid activation recompute method.")
    assert config.recompute_num_layers == 1, "recompute_num_layers must be 1 for MTP recompute"
    # hidden_states first: it is the tensor distribute_saved_activations splits.
    tensor_names = sorted((name for name, value in arguments.items() if _travels_through_checkpoint(value)),
                          key=lambda name: name != "hidden_states")
    captured = {name: value for name, value in arguments.items() if name not in tensor_names}

    def forward_with_captured(*tensors: Any) -> Tensor:
        *given, mask = tensors
        return layer._proj_and_transformer_layer(padding_mask=mask, **dict(zip(tensor_names, given, strict=True)),
                                                 **captured)

    return tensor_parallel.checkpoint(
        forward_with_captured, config.distribute_saved_activations,
        *(arguments[name] for name in tensor_names), padding_mask,
    )


def wrap_checkpointed_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: accept ``padding_mask`` as 0.19 does."""

    @functools.wraps(original)
    def _checkpointed_forward(self, *args: Any, padding_mask: Optional[Tensor] = None, **kwargs: Any) -> Any:
        if padding_mask is None:
            return original(self, *args, **kwargs)
        names = ("hidden_states", "decoder_input", "attention_mask")
        arguments = dict(zip(names[: len(args)], args, strict=True)) | kwargs
        return _recompute_with_padding_mask(self, padding_mask, arguments)

    return _checkpointed_forward
