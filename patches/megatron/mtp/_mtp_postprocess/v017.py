"""``GPTModel._postprocess`` for megatron-core 0.17+: main-head logits, MTP losses attached.

Derived from upstream ``GPTModel._postprocess`` of 0.17-0.19 (0.20 main: the same code), where
the MTP loss lives in the module-level ``process_mtp_loss``. What changes: with MTP configured and
no caller-supplied ``output_processor`` (0.18+), the patched call runs the MTP block and upstream's
own ``process_mtp_loss`` (so rolling, scaling, clamped normalisation and tracker logging are
upstream's) and returns the main-head logits ``[b, s, v]`` instead of the LM loss. What it hands
``process_mtp_loss`` differs from upstream's own call, on purpose:

- the output layer, detached unless the model's options say ``output_head="trained"``
  (``mtp._options``; 0.19's ``mtp_detach_heads`` still works on top: it detaches what it detaches);
- the CP group, ``packed_seq_params.cp_group`` when dynamic CP sets one, else the model's.

``labels=None`` (``mtp._options``'s ``without_labels``): by default the MTP block is skipped
and the main-head logits returned on every release (0.17-0.18 run the block and compute no loss;
0.19 derives MTP labels from ``input_ids`` and attaches every depth's loss, which a reference
model's log-prob pass pays for and, differentiated, gets other gradients from). With
``"derive"`` the labels are derived as 0.19 derives them (input ids and loss mask rolled left
once, the same ``roll_tensor`` call as 0.19's), with ``"derive-mask-as-given"`` as ROLL derives
them (the mask as given), before ``process_mtp_loss``, which is handed the labels.

With labels, ``with_labels="derive"`` hands ``process_mtp_loss`` labels rolled from ``input_ids``
(the caller's loss mask as given) and ``"skip"`` runs no MTP block; ``mtp_kwargs`` takes the labels
from slime's ``mtp_labels``; ``per_token_loss="unscaled"`` gives ``process_mtp_loss`` a loss
function that undoes its per-token rescale in the gradient (``loss_parts.undo_per_token_rescale``);
``returns="loss"`` returns upstream's LM loss; ``mtp.loss_scale(factor)`` hands it a copy of the
config whose ``mtp_loss_scaling_factor`` is multiplied by the factor.

Every other call (inference or speculative decoding, a pipeline stage without the output layer,
no MTP, a caller's ``output_processor``, a model marked disabled, a positional caller) goes to the
original unchanged. 0.17's ``_postprocess`` takes ``is_spec_decode``; 0.18+ take ``padding_mask``,
``output_processor`` and ``output_processor_context``: every keyword the caller gave is passed on.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
from megatron.core.transformer.multi_token_prediction import process_mtp_loss, roll_tensor

from patchkit.runtime.probing import accepts_parameter, get_field

from .._loss_scale import current_loss_scale
from .._mtp_kwargs import current_mtp_labels
from .._options import options_for
from .logits import main_head_logits
from .loss_parts import mtp_cp_group, mtp_output_layer, mtp_targets, scaled_config, undo_per_token_rescale

try:  # 0.18+: inference is a process-wide mode, not a context argument
    from megatron.core.inference.utils import InferenceMode
except ImportError:  # 0.17
    InferenceMode = None

_TAKES_TP_GROUP = accepts_parameter(process_mtp_loss, "tp_group")
# Keywords of _postprocess that the MTP block takes under the same name.
_MTP_BLOCK_KEYWORDS = (
    "input_ids", "position_ids", "hidden_states", "attention_mask", "rotary_pos_emb", "rotary_pos_cos",
    "rotary_pos_sin", "packed_seq_params", "sequence_len_offset", "padding_mask",
)


def _in_inference(model: Any, kwargs: dict[str, Any]) -> bool:
    if kwargs.get("is_spec_decode"):
        return True
    if InferenceMode is not None and InferenceMode.is_active():
        return True
    return kwargs.get("inference_context") is not None and not model.training


def _handled_here(model: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    return (
        not args  # GPTModel.forward passes everything by keyword; a positional caller is left to upstream
        and kwargs.get("output_processor") is None
        and bool(get_field(model.config, "mtp_num_layers", 0))
        and model.post_process
        and not _in_inference(model, kwargs)
        and options_for(model).enabled
    )


def _run_mtp_block(model: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    block_kwargs = {name: kwargs[name] for name in _MTP_BLOCK_KEYWORDS if name in kwargs}
    return model.mtp(
        **block_kwargs,
        inference_params=None,  # as upstream: MTP layers keep no KV cache
        embedding=model.embedding,
        **(kwargs.get("extra_block_kwargs") or {}),
    )


def _roll_left(kwargs: dict[str, Any], cp_group: Any) -> Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    return functools.partial(
        roll_tensor, shifts=-1, dims=-1, cp_group=cp_group, packed_seq_params=kwargs.get("packed_seq_params")
    )


def _attach_mtp_losses(model: Any, hidden_states: torch.Tensor, kwargs: dict[str, Any], output_weight: Any,
                       targets: tuple[torch.Tensor, Optional[torch.Tensor]], cp_group: Any) -> torch.Tensor:
    labels, loss_mask = targets
    options = options_for(model)
    compute_loss = model.compute_language_model_loss
    if model.config.calculate_per_token_loss and not options.rescale_per_token_loss:
        compute_loss = undo_per_token_rescale(compute_loss, labels, loss_mask, _roll_left(kwargs, cp_group))
    optional: dict[str, Any] = {}
    if _TAKES_TP_GROUP:
        optional["tp_group"] = model.tp_group
    return process_mtp_loss(
        hidden_states=hidden_states,
        labels=labels,
        loss_mask=loss_mask,
        output_layer=mtp_output_layer(model, options.detach_output_head),
        output_weight=output_weight,
        runtime_gather_output=kwargs.get("runtime_gather_output"),
        is_training=model.training,
        compute_language_model_loss=compute_loss,
        config=scaled_config(model.config, current_loss_scale()),
        cp_group=cp_group,
        packed_seq_params=kwargs.get("packed_seq_params"),
        scale_logits_fn=model._scale_logits if model.config.use_mup else None,
        **optional,
    )


def wrap_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: the patched ``_postprocess``, delegating to ``original`` when unchanged."""

    @functools.wraps(original)
    def _postprocess(self, *args: Any, **kwargs: Any) -> Any:
        if not _handled_here(self, args, kwargs):
            return original(self, *args, **kwargs)

        hidden_states = kwargs["hidden_states"]
        options = options_for(self)
        output_weight = None
        if self.share_embeddings_and_output_weights:
            output_weight = self.shared_embedding_or_output_weight()
        cp_group = mtp_cp_group(kwargs.get("packed_seq_params"), self.pg_collection.cp)
        labels = kwargs.get("labels")
        targets = mtp_targets(
            options, labels, kwargs.get("loss_mask"), kwargs.get("input_ids"),
            current_mtp_labels() if options.mtp_kwargs else None, _roll_left(kwargs, cp_group),
        )
        if targets is None:
            # A log-prob pass (reference model, rollout scoring) or a model whose MTP is not trained
            # (with_labels="skip"): no MTP loss, so no MTP block to run.
            if not kwargs.get("mtp_in_postprocess"):
                hidden_states = torch.chunk(hidden_states, 1 + self.config.mtp_num_layers, dim=0)[0]
        else:
            if kwargs.get("mtp_in_postprocess"):
                hidden_states = _run_mtp_block(self, kwargs)
            hidden_states = _attach_mtp_losses(self, hidden_states, kwargs, output_weight, targets, cp_group)
        return main_head_logits(
            self,
            hidden_states,
            output_weight,
            kwargs.get("runtime_gather_output"),
            scale_logits=self._scale_logits,
            logger_payload={name: kwargs.get(name) for name in
                            ("input_ids", "position_ids", "attention_mask", "decoder_input")},
            loss_labels=labels if options.returns == "loss" else None,
        )

    return _postprocess
