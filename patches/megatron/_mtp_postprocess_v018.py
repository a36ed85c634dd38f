"""``GPTModel._postprocess`` for megatron-core 0.18-0.19: main-head logits, MTP losses attached.

From 0.18 upstream's ``_postprocess`` runs the MTP block and ``process_mtp_loss`` and then hands
the main hidden states to an ``output_processor`` when one is given. What changes: with ``labels``
given, MTP configured and no caller-supplied ``output_processor``, the original runs with an
output processor that returns the main-head logits ``[b, s, v]`` instead of the LM loss. All MTP
work (block, label/mask rolling, scaling, normalisation, tracker logging, 0.19's
``mtp_detach_heads``) is therefore upstream's own code. Every other call goes to the original
unchanged (in 0.19 a ``labels=None`` call already returns logits and derives MTP labels from
``input_ids``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

from megatron.core.inference.utils import InferenceMode
from torch import Tensor

from patchkit.runtime.probing import get_field


def main_head_logits_processor(
    *,
    hidden_states: Tensor,
    output_layer: Callable[..., Any],
    output_weight: Optional[Tensor],
    runtime_gather_output: Optional[bool],
    scale_logits: Callable[[Tensor], Tensor],
    **_unused: Any,
) -> Tensor:
    """An upstream ``output_processor``: logits of the main head, ``[b, s, v]``."""
    logits, _ = output_layer(
        hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output
    )
    return scale_logits(logits).transpose(0, 1).contiguous()


def wrap_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: adds the logits output processor to calls with labels and MTP."""

    @functools.wraps(original)
    def _postprocess(self, *args: Any, **kwargs: Any) -> Any:
        # GPTModel.forward passes everything by keyword; a positional caller is left to upstream.
        if (
            not args
            and kwargs.get("labels") is not None
            and kwargs.get("output_processor") is None
            and get_field(self.config, "mtp_num_layers", 0)
            and not InferenceMode.is_active()
        ):
            kwargs["output_processor"] = main_head_logits_processor
        return original(self, *args, **kwargs)

    return _postprocess
