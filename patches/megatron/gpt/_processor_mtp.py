"""The MTP steps megatron-core 0.18's ``_postprocess`` takes before an ``output_processor``, for 0.14-0.17.

0.18, with a processor: the MTP block runs where this stage holds it (not in inference), then, on
the stage with the output layer, ``process_mtp_loss`` cuts the hidden states to the main chunk and
attaches each depth's loss through ``MTPLossAutoScaler`` (labels and loss mask rolled left once per
depth, token counts clamped to at least 1, per-token losses rescaled by the tokens rolled off,
training losses logged to ``MTPLossLoggingHelper``); the processor gets the main chunk, so the MTP
layers train through whatever the processor's result is differentiated into.

0.17 has that same ``process_mtp_loss`` and it is called. 0.14-0.16 compute the MTP loss inline in
``_postprocess``, with other normalisation (an unclamped count, no per-token rescale), so
``attach_mtp_losses`` is 0.18's function over the release's ``roll_tensor``. 0.14-0.15's
``roll_tensor`` rolls packed (THD) sequences as one sequence, as those releases' MTP block rolls its
own inputs; 0.16+ roll each packed sequence.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import torch
from megatron.core.transformer import multi_token_prediction as mtp_module
from megatron.core.transformer.multi_token_prediction import roll_tensor
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from patchkit.runtime.probing import accepts_parameter, get_field

from ..mtp._depth_losses import attach_depth_losses

# 0.17+: the loss lives in a module-level function, the one 0.18 calls.
_UPSTREAM_PROCESS_MTP_LOSS: Optional[Callable[..., Tensor]] = getattr(mtp_module, "process_mtp_loss", None)
# 0.16 taught roll_tensor to roll packed sequences one by one.
_ROLL_TAKES_PACKED_SEQ_PARAMS = accepts_parameter(roll_tensor, "packed_seq_params")
# 0.16 added standalone MTP pipeline stages (the block may run in an earlier stage than the output layer).
_MTP_STANDALONE_STAGES = "mtp_standalone" in {f.name for f in dataclasses.fields(TransformerConfig)}
# 0.17 added speculative decoding, whose serial MTP reads the decoder hidden states cached here.
_SPEC_DECODE_CACHE = "_decoder_hidden_states_cache"
# Keywords of _postprocess the MTP block takes under the same name (0.14-0.17 take no padding_mask).
_MTP_BLOCK_KEYWORDS = (
    "input_ids", "position_ids", "attention_mask", "rotary_pos_emb", "rotary_pos_cos", "rotary_pos_sin",
    "packed_seq_params", "sequence_len_offset",
)


def in_inference(model: Any, inference_context: Any, is_spec_decode: Any) -> bool:
    """0.14-0.17's test for inference (a context and eval mode), or 0.17's speculative decoding."""
    return bool(is_spec_decode) or (inference_context is not None and not model.training)


def run_mtp_block(model: Any, hidden_states: Tensor, block_kwargs: dict[str, Any],
                  extra_block_kwargs: Optional[dict[str, Any]]) -> Tensor:
    """The MTP block over the decoder's hidden states, called as 0.18 calls it (no KV cache)."""
    return model.mtp(
        hidden_states=hidden_states,
        **{name: block_kwargs.get(name) for name in _MTP_BLOCK_KEYWORDS},
        inference_params=None,
        embedding=model.embedding,
        **(extra_block_kwargs or {}),
    )


def holds_mtp_output(model: Any) -> bool:
    """Whether the hidden states reaching this stage's output layer carry the MTP depths' chunks.

    0.16+ key it on the config (a standalone MTP stage may run the block before this one); 0.14-0.15
    run the block only in the output layer's stage, where ``mtp_process`` is set.
    """
    if not _MTP_STANDALONE_STAGES:
        return bool(getattr(model, "mtp_process", False))
    return bool(get_field(model.config, "mtp_num_layers", 0))


def cache_for_spec_decode(model: Any, hidden_states: Tensor) -> None:
    """0.17+ keep the decoder hidden states for the serial MTP pass after verification; before, nothing reads them."""
    if _UPSTREAM_PROCESS_MTP_LOSS is not None:
        setattr(model, _SPEC_DECODE_CACHE, hidden_states)


def _cp_group(model: Any) -> Any:
    collection = getattr(model, "pg_collection", None)
    return collection.cp if collection is not None else model.cp_group


def attach_mtp_losses(model: Any, hidden_states: Tensor, labels: Optional[Tensor], loss_mask: Optional[Tensor],
                      output_weight: Optional[Tensor], runtime_gather_output: Optional[bool],
                      packed_seq_params: Any) -> Tensor:
    """0.18's ``process_mtp_loss`` as ``_postprocess`` calls it: the main chunk, each depth's loss attached."""
    config = model.config
    scale_logits_fn = model._scale_logits if get_field(config, "use_mup", False) else None
    if _UPSTREAM_PROCESS_MTP_LOSS is not None:
        return _UPSTREAM_PROCESS_MTP_LOSS(
            hidden_states=hidden_states, labels=labels, loss_mask=loss_mask, output_layer=model.output_layer,
            output_weight=output_weight, runtime_gather_output=runtime_gather_output, is_training=model.training,
            compute_language_model_loss=model.compute_language_model_loss, config=config,
            cp_group=_cp_group(model), packed_seq_params=packed_seq_params, scale_logits_fn=scale_logits_fn,
        )
    return _process_mtp_loss_018(model, hidden_states, labels, loss_mask, output_weight, runtime_gather_output,
                                 packed_seq_params)


def _process_mtp_loss_018(model: Any, hidden_states: Tensor, labels: Optional[Tensor], loss_mask: Optional[Tensor],
                          output_weight: Optional[Tensor], runtime_gather_output: Optional[bool],
                          packed_seq_params: Any) -> Tensor:
    """Upstream 0.18.0's ``process_mtp_loss`` on 0.14-0.16 (no MuP there): the shared depth loop."""
    if labels is None:
        return torch.chunk(hidden_states, 1 + model.config.mtp_num_layers, dim=0)[0]
    roll_kwargs: dict[str, Any] = {"shifts": -1, "dims": -1, "cp_group": _cp_group(model)}
    if _ROLL_TAKES_PACKED_SEQ_PARAMS:
        roll_kwargs["packed_seq_params"] = packed_seq_params
    return attach_depth_losses(
        model, hidden_states, labels, loss_mask,
        output_layer=model.output_layer, output_weight=output_weight,
        runtime_gather_output=runtime_gather_output, roll_left=functools.partial(roll_tensor, **roll_kwargs),
    )
