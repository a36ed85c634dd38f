"""0.18's ``output_processor`` hook on ``GPTModel.forward`` for megatron-core 0.14-0.17.

With a processor, this call's ``_postprocess`` is replaced (on the instance, for the call only) by
0.18's processor branch: with MTP, the MTP block and 0.18's MTP loss first (``_processor_mtp``),
then the same keywords to the processor, whose result the forward returns. Without one, the call is
upstream's, unchanged. The instance attribute also stands in front of a class-level wrap of
``_postprocess`` (``megatron.mtp_postprocess``), as on 0.18, where that patch hands any call with a
processor to upstream.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ._processor_mtp import attach_mtp_losses, cache_for_spec_decode, holds_mtp_output, in_inference, run_mtp_block

KEYWORDS = ("output_processor", "output_processor_context")
_NONE = object()


def _unscaled(logits: Any) -> Any:
    return logits  # 0.14-0.16 have no MuP logit scaling (GPTModel._scale_logits arrived in 0.17)


def _processor_postprocess(model: Any, processor: Callable[..., Any], context: Any) -> Callable[..., Any]:
    """0.18's ``_postprocess`` with a processor: MTP block and MTP loss as 0.18 runs them, then the processor."""

    # GPTModel.forward passes everything by keyword; the first eight also work positionally, as upstream's.
    def _postprocess(hidden_states: Any, input_ids: Any, position_ids: Any, labels: Any, rotary_pos_emb: Any = None,
                     rotary_pos_cos: Any = None, rotary_pos_sin: Any = None, mtp_in_postprocess: Any = None, *,
                     loss_mask: Any = None, decoder_input: Any = None, attention_mask: Any = None,
                     packed_seq_params: Any = None, runtime_gather_output: Any = None, extra_block_kwargs: Any = None,
                     inference_context: Any = None, is_spec_decode: Any = None, **block_kwargs: Any) -> Any:
        inference = in_inference(model, inference_context, is_spec_decode)
        if mtp_in_postprocess and not inference:
            block_kwargs.update(input_ids=input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                packed_seq_params=packed_seq_params, rotary_pos_emb=rotary_pos_emb,
                                rotary_pos_cos=rotary_pos_cos, rotary_pos_sin=rotary_pos_sin)
            hidden_states = run_mtp_block(model, hidden_states, block_kwargs, extra_block_kwargs)
        if not model.post_process:
            return hidden_states
        output_weight = model.shared_embedding_or_output_weight() if model.share_embeddings_and_output_weights else None
        if holds_mtp_output(model):
            if inference:
                cache_for_spec_decode(model, hidden_states)
            else:
                hidden_states = attach_mtp_losses(model, hidden_states, labels, loss_mask, output_weight,
                                                  runtime_gather_output, packed_seq_params)
        return processor(
            hidden_states=hidden_states,
            output_layer=model.output_layer,
            output_weight=output_weight,
            labels=labels,
            loss_mask=loss_mask,
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention_mask,
            decoder_input=decoder_input,
            inference_context=inference_context,
            packed_seq_params=packed_seq_params,
            runtime_gather_output=runtime_gather_output,
            context=context,
            compute_language_model_loss=model.compute_language_model_loss,
            scale_logits=getattr(model, "_scale_logits", _unscaled),
            config=model.config,
        )

    return _postprocess


def _with_keywords(original: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(original)
    parameters = list(signature.parameters.values())
    at = len(parameters) - 1 if parameters and parameters[-1].kind is inspect.Parameter.VAR_KEYWORD else len(parameters)
    for name in reversed(KEYWORDS):
        if name not in signature.parameters:
            parameters.insert(at, inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None))
    return signature.replace(parameters=parameters)


def wrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, output_processor: Callable[..., Any] | None = None,
                output_processor_context: Any = None, **kwargs: Any) -> Any:
        if output_processor is None:
            return original(self, *args, **kwargs)
        # An instance-level _postprocess (a framework's per-model patch) is put back afterwards.
        before = vars(self).get("_postprocess", _NONE)
        self._postprocess = _processor_postprocess(self, output_processor, output_processor_context)
        try:
            return original(self, *args, **kwargs)
        finally:
            if before is _NONE:
                del self._postprocess
            else:
                self._postprocess = before

    # Frameworks probe the signature for the hook (verl: both names in inspect.signature(forward)).
    forward.__signature__ = _with_keywords(original)  # type: ignore[attr-defined]
    return forward
