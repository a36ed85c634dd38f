"""``GPTModel._postprocess`` for megatron-core 0.14-0.16: main-head logits, MTP losses attached.

Derived from upstream ``GPTModel._postprocess`` in 0.14.0-0.16.1, where the MTP loss is computed
inline. What changes: with ``labels`` given and MTP configured, upstream returns the main LM loss;
this returns the main-head logits ``[b, s, v]`` instead (an RL trainer computes its own log-probs
and policy loss from them), while each MTP depth's cross-entropy is still computed and attached to
the main hidden states through ``MTPLossAutoScaler`` as upstream attaches it, so the MTP layers
train in backward. Where this differs from upstream's loop, on purpose:

- the MTP logits come from the output layer detached unless the model's options say
  ``output_head="trained"`` (``mtp._options``);
- the per-depth token count is clamped to at least 1 (upstream divides by it: NaN gradients when a
  rank or micro-batch has no loss token; 0.17+ clamp the same way);
- with ``calculate_per_token_loss`` each depth's loss is rescaled by the loss mask's token count
  before rolling over the depth's count after rolling, as 0.17+'s ``process_mtp_loss`` does:
  ``finalize_model_grads`` divides every gradient by the main loss's token count, and a depth
  whose rolled mask holds fewer tokens would otherwise weigh its tokens less than the main loss
  does (0.14-0.16 attach the unscaled per-token loss, which ``per_token_loss="unscaled"`` keeps);
- labels and mask roll over ``packed_seq_params.cp_group`` when dynamic CP sets one (0.16);
- ``labels=None`` (upstream raises there: it clones ``labels`` for MTP) returns the main-head
  logits and skips the MTP block by default; with ``without_labels="derive"`` the MTP labels are
  derived from ``input_ids`` as 0.19 derives them, with ``"derive-mask-as-given"`` as ROLL derives
  them (``mtp._options``);
- ``with_labels="derive"`` takes the MTP labels from ``input_ids`` even with labels given,
  ``"skip"`` runs no MTP block at all; ``mtp_kwargs`` takes them from slime's ``mtp_labels``;
  ``returns="loss"`` returns upstream's LM loss instead of the logits; ``mtp.loss_scale(factor)``
  multiplies ``mtp_loss_scaling_factor`` for the forwards inside it.

Every other call (no MTP, inference, a pipeline stage without the output layer, a model marked
disabled) goes to the original unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import torch
from megatron.core.transformer.multi_token_prediction import roll_tensor
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from patchkit.runtime.probing import accepts_parameter, get_field

from .._depth_losses import attach_depth_losses
from .._loss_scale import current_loss_scale
from .._mtp_kwargs import current_mtp_labels
from .._options import options_for
from .logits import main_head_logits
from .loss_parts import mtp_cp_group, mtp_output_layer, mtp_targets

# 0.16 added standalone MTP pipeline stages: the output-layer stage may hold MTP hidden states
# without running the MTP block, so upstream keys the loss on the config, not on ``mtp_process``.
_MTP_STANDALONE_STAGES = "mtp_standalone" in {f.name for f in dataclasses.fields(TransformerConfig)}
# 0.16 taught roll_tensor to roll packed (THD) sequences one by one.
_ROLL_TAKES_PACKED_SEQ_PARAMS = accepts_parameter(roll_tensor, "packed_seq_params")


def _computes_mtp_loss(model: Any) -> bool:
    if _MTP_STANDALONE_STAGES:
        return bool(get_field(model.config, "mtp_num_layers", 0))
    return bool(getattr(model, "mtp_process", False))


def _roll_left(model: Any, packed_seq_params: Any) -> Callable[[Tensor], tuple[Tensor, Tensor]]:
    """Upstream's ``roll_tensor`` one token left, over the batch's CP group (and packed sequences, 0.16)."""
    roll_kwargs: dict[str, Any] = {
        "shifts": -1, "dims": -1, "cp_group": mtp_cp_group(packed_seq_params, model.cp_group),
    }
    if _ROLL_TAKES_PACKED_SEQ_PARAMS:
        roll_kwargs["packed_seq_params"] = packed_seq_params
    return functools.partial(roll_tensor, **roll_kwargs)


def attach_mtp_losses(
    model: Any,
    hidden_states: Tensor,
    labels: Tensor,
    loss_mask: Optional[Tensor],
    output_weight: Optional[Tensor],
    runtime_gather_output: Optional[bool],
    packed_seq_params: Any,
    detach_output_head: bool = True,
    rescale_per_token_loss: bool = True,
) -> Tensor:
    """Split off the MTP hidden states, attach each depth's loss, return the main hidden states.

    The shared depth loop (``mtp._depth_losses``) with what the module docstring lists: the count
    clamped, the per-token loss rescaled as 0.17+ rescale it (unless ``rescale_per_token_loss`` is
    False: upstream's 0.14-0.16 weighting), the CP group taken from the batch where dynamic CP sets
    one, the output head optionally detached and ``mtp.loss_scale(...)`` applied.
    """
    return attach_depth_losses(
        model, hidden_states, labels, loss_mask,
        output_layer=mtp_output_layer(model, detach_output_head),
        output_weight=output_weight,
        runtime_gather_output=runtime_gather_output,
        roll_left=_roll_left(model, packed_seq_params),
        loss_scale=current_loss_scale(),
        rescale_per_token_loss=rescale_per_token_loss,
    )


def wrap_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: the patched ``_postprocess``, delegating to ``original`` when unchanged."""

    @functools.wraps(original)
    def _postprocess(
        self,
        hidden_states,
        input_ids,
        position_ids,
        labels,
        rotary_pos_emb,
        rotary_pos_cos,
        rotary_pos_sin,
        mtp_in_postprocess=None,
        loss_mask=None,
        decoder_input=None,
        attention_mask=None,
        inference_params=None,
        packed_seq_params=None,
        sequence_len_offset=None,
        runtime_gather_output=None,
        extra_block_kwargs=None,
        inference_context=None,
    ):
        in_inference_mode = inference_context is not None and not self.training
        options = options_for(self)
        if (
            not options.enabled
            or in_inference_mode
            or not self.post_process
            or not _computes_mtp_loss(self)
        ):
            return original(
                self,
                hidden_states=hidden_states,
                input_ids=input_ids,
                position_ids=position_ids,
                labels=labels,
                rotary_pos_emb=rotary_pos_emb,
                rotary_pos_cos=rotary_pos_cos,
                rotary_pos_sin=rotary_pos_sin,
                mtp_in_postprocess=mtp_in_postprocess,
                loss_mask=loss_mask,
                decoder_input=decoder_input,
                attention_mask=attention_mask,
                inference_params=inference_params,
                packed_seq_params=packed_seq_params,
                sequence_len_offset=sequence_len_offset,
                runtime_gather_output=runtime_gather_output,
                extra_block_kwargs=extra_block_kwargs,
                inference_context=inference_context,
            )

        output_weight = None
        if self.share_embeddings_and_output_weights:
            output_weight = self.shared_embedding_or_output_weight()
        # returns="loss": upstream's LM loss against the caller's labels, not the MTP ones below.
        loss_labels = labels if options.returns == "loss" else None
        targets = mtp_targets(
            options, labels, loss_mask, input_ids, current_mtp_labels() if options.mtp_kwargs else None,
            _roll_left(self, packed_seq_params),
        )
        if targets is None:
            # Without labels upstream clones them for MTP and raises. A log-prob pass (reference
            # model, rollout scoring), or a model whose MTP is not trained (with_labels="skip"), needs
            # only the main head: skip the MTP block; hidden states that already hold MTP outputs
            # (a standalone MTP stage, 0.16) are cut to the main chunk.
            if not mtp_in_postprocess:
                hidden_states = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)[0]
            return main_head_logits(self, hidden_states, output_weight, runtime_gather_output,
                                    loss_labels=loss_labels)
        labels, loss_mask = targets
        if mtp_in_postprocess:
            hidden_states = self.mtp(
                input_ids=input_ids,
                position_ids=position_ids,
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                inference_params=inference_params,
                rotary_pos_emb=rotary_pos_emb,
                rotary_pos_cos=rotary_pos_cos,
                rotary_pos_sin=rotary_pos_sin,
                packed_seq_params=packed_seq_params,
                sequence_len_offset=sequence_len_offset,
                embedding=self.embedding,
                **(extra_block_kwargs or {}),
            )
        hidden_states = attach_mtp_losses(
            self,
            hidden_states,
            labels,
            loss_mask,
            output_weight,
            runtime_gather_output,
            packed_seq_params,
            detach_output_head=options.detach_output_head,
            rescale_per_token_loss=options.rescale_per_token_loss,
        )
        return main_head_logits(
            self,
            hidden_states,
            output_weight,
            runtime_gather_output,
            logger_payload={
                "input_ids": input_ids,
                "position_ids": position_ids,
                "attention_mask": attention_mask,
                "decoder_input": decoder_input,
            },
            loss_labels=loss_labels,
        )

    return _postprocess
