"""Each MTP depth's loss attached to the main hidden states: the loop every MTP loss path shares.

The loop of upstream's ``process_mtp_loss`` (0.17+; inline in ``_postprocess`` on 0.14-0.16): the
hidden states are cut into the main chunk and one chunk per depth; per depth the labels and loss
mask roll one token left, the depth's cross-entropy is masked, logged to ``MTPLossLoggingHelper`` in
training and attached to the main chunk through ``MTPLossAutoScaler``, scaled by
``mtp_loss_scaling_factor / mtp_num_layers`` and normalised per token as 0.17+ normalise it (the
count clamped to at least 1; per-token losses rescaled by the tokens rolled off). Two callers:

- the MTP postprocess backport (``_mtp_postprocess.v014``), which may detach the output head, scale
  by ``mtp.loss_scale(...)`` and keep 0.14-0.16's un-rescaled per-token weighting;
- the output-processor backport (``gpt._processor_mtp``), which runs it as 0.18 does.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from megatron.core import parallel_state
from megatron.core.transformer.multi_token_prediction import MTPLossAutoScaler, MTPLossLoggingHelper
from torch import Tensor

from ._mtp_postprocess.loss_parts import safe_token_count

#: ``roll_tensor`` bound to one token left over the right CP group: ``(rolled, count of the rolled)``.
RollLeft = Callable[[Tensor], "tuple[Tensor, Tensor]"]


def attach_depth_losses(
    model: Any,
    hidden_states: Tensor,
    labels: Tensor,
    loss_mask: Optional[Tensor],
    *,
    output_layer: Any,
    output_weight: Optional[Tensor],
    runtime_gather_output: Optional[bool],
    roll_left: RollLeft,
    loss_scale: float = 1.0,
    rescale_per_token_loss: bool = True,
) -> Tensor:
    """The main chunk of ``hidden_states`` with every MTP depth's loss attached.

    ``output_layer`` is what computes each depth's logits (the model's, or a detached view of it);
    ``loss_scale`` multiplies ``mtp_loss_scaling_factor``; ``rescale_per_token_loss=False`` attaches
    per-token losses unscaled, as 0.14-0.16 do. Each depth's logits are dropped once its loss exists.
    """
    config = model.config
    num_depths = config.mtp_num_layers
    hidden_states_list = torch.chunk(hidden_states, 1 + num_depths, dim=0)
    hidden_states = hidden_states_list[0]
    mtp_labels = labels.clone()
    if loss_mask is None:
        loss_mask = torch.ones_like(mtp_labels)
    # Before any roll: the token count finalize_model_grads divides by under calculate_per_token_loss.
    original_num_tokens = loss_mask.sum()
    mtp_loss_scale = config.mtp_loss_scaling_factor * loss_scale / num_depths
    for depth in range(num_depths):
        mtp_logits, _ = output_layer(
            hidden_states_list[depth + 1], weight=output_weight, runtime_gather_output=runtime_gather_output,
        )
        mtp_labels, _ = roll_left(mtp_labels)
        loss_mask, num_tokens = roll_left(loss_mask)
        num_tokens = safe_token_count(num_tokens)
        mtp_loss = loss_mask * model.compute_language_model_loss(mtp_labels, mtp_logits)
        del mtp_logits
        if model.training:
            MTPLossLoggingHelper.save_loss_to_tracker(
                torch.sum(mtp_loss) / num_tokens, depth, num_depths,
                avg_group=parallel_state.get_data_parallel_group(with_context_parallel=True),
            )
        if not config.calculate_per_token_loss:
            depth_loss = mtp_loss_scale * mtp_loss / num_tokens
        elif rescale_per_token_loss:
            # finalize_model_grads divides by the main loss's token count; a depth has fewer after
            # rolling, so its tokens are rescaled to weigh what the main loss's tokens weigh.
            depth_loss = mtp_loss_scale * mtp_loss * (original_num_tokens / num_tokens)
        else:
            depth_loss = mtp_loss_scale * mtp_loss
        hidden_states = MTPLossAutoScaler.apply(hidden_states, depth_loss)
    return hidden_states
