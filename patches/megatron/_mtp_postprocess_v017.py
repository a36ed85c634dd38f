"""``GPTModel._postprocess`` for megatron-core 0.17: main-head logits, MTP losses attached.

Derived from upstream ``GPTModel._postprocess`` in 0.17.x, where the MTP loss lives in the
module-level ``process_mtp_loss`` and ``_postprocess`` takes ``is_spec_decode``. What changes: with
``labels`` given and MTP configured, upstream returns the main LM loss; this returns the
main-head logits ``[b, s, v]`` after ``process_mtp_loss`` (upstream's own function, so rolling,
scaling, normalisation and tracker logging are exactly upstream's) has attached every depth's
loss to the main hidden states. Every other call (no labels, no MTP, inference or speculative
decoding, a pipeline stage without the output layer) goes to the original unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from megatron.core.transformer.multi_token_prediction import process_mtp_loss

from patchkit.runtime.probing import get_field

from ._mtp_postprocess_logits import main_head_logits


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
        is_spec_decode=None,
    ):
        in_inference_mode = inference_context is not None and not self.training
        if (
            labels is None
            or in_inference_mode
            or is_spec_decode
            or not self.post_process
            or not get_field(self.config, "mtp_num_layers", 0)
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
                is_spec_decode=is_spec_decode,
            )

        output_weight = None
        if self.share_embeddings_and_output_weights:
            output_weight = self.shared_embedding_or_output_weight()
        if mtp_in_postprocess:
            hidden_states = self.mtp(
                input_ids=input_ids,
                position_ids=position_ids,
                hidden_states=hidden_states,
                attention_mask=attention_mask,
                inference_params=None,  # as upstream: MTP layers keep no KV cache
                rotary_pos_emb=rotary_pos_emb,
                rotary_pos_cos=rotary_pos_cos,
                rotary_pos_sin=rotary_pos_sin,
                packed_seq_params=packed_seq_params,
                sequence_len_offset=sequence_len_offset,
                embedding=self.embedding,
                **(extra_block_kwargs or {}),
            )
        hidden_states = process_mtp_loss(
            hidden_states=hidden_states,
            labels=labels,
            loss_mask=loss_mask,
            output_layer=self.output_layer,
            output_weight=output_weight,
            runtime_gather_output=runtime_gather_output,
            is_training=self.training,
            compute_language_model_loss=self.compute_language_model_loss,
            config=self.config,
            cp_group=self.pg_collection.cp,
            packed_seq_params=packed_seq_params,
            scale_logits_fn=self._scale_logits if self.config.use_mup else None,
        )
        return main_head_logits(
            self,
            hidden_states,
            output_weight,
            runtime_gather_output,
            scale_logits=self._scale_logits,
            logger_payload={
                "input_ids": input_ids,
                "position_ids": position_ids,
                "attention_mask": attention_mask,
                "decoder_input": decoder_input,
            },
        )

    return _postprocess
