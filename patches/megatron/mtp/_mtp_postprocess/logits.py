"""The main-head logits the MTP postprocess patch returns instead of the LM loss.

Derived from the tail of ``GPTModel._postprocess`` (megatron-core 0.14-0.19): output layer,
optional logit scaling (MuP, 0.17+), config-logger dump, then ``[s, b, v] -> [b, s, v]`` exactly
as upstream does when ``labels`` is None. The inference-only branches of that tail
(last-token materialisation, sequence-parallel override) are not reproduced: the patched path is
never taken in inference mode.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Optional

from megatron.core.config_logger import has_config_logger_enabled, log_config_to_disk
from torch import Tensor


def main_head_logits(
    model: Any,
    hidden_states: Tensor,
    output_weight: Optional[Tensor],
    runtime_gather_output: Optional[bool],
    scale_logits: Optional[Callable[[Tensor], Tensor]] = None,
    logger_payload: Optional[dict[str, Any]] = None,
    loss_labels: Optional[Tensor] = None,
) -> Tensor:
    """Run ``model.output_layer`` on the main hidden states and return ``[batch, seq, vocab]``.

    With ``loss_labels`` (``returns="loss"``), return upstream's LM loss against them instead,
    ``model.compute_language_model_loss(labels, logits)`` ``[batch, seq]``, as upstream's tail does.
    """
    logits, _ = model.output_layer(
        hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output
    )
    if scale_logits is not None:
        logits = scale_logits(logits)
    if logger_payload is not None and has_config_logger_enabled(model.config):
        log_config_to_disk(
            model.config, OrderedDict({**logger_payload, "logits": logits}), prefix="input_and_logits"
        )
    if loss_labels is not None:
        return model.compute_language_model_loss(loss_labels, logits)
    # [s b v] => [b s v], as upstream returns logits when labels is None.
    return logits.transpose(0, 1).contiguous()
