"""``MultiTokenPredictionLayer._get_embeddings`` with the MTP layer's inputs cut from the graph.

Derived from upstream ``MultiTokenPredictionLayer._get_embeddings`` (megatron-core 0.14-0.19 and
main 0.20),
which rolls the token/position ids, embeds them with the main model's embedding and returns the
embeddings (``decoder_input``) and the incoming hidden states as the MTP layer's inputs. What
changes: both are detached, so the MTP loss trains the MTP layers (and, through the shared output
head, the output layer) but sends no gradient into the embedding or the decoder. The hidden states
keep their ``requires_grad`` flag, because activation recomputation needs one input that requires
grad to produce a differentiable output (upstream 0.19 does the same for ``mtp_detach_heads``).

Both call paths reach this method: ``MultiTokenPredictionBlock.forward`` and the fine-grained
(overlapped) schedule's MTP callables. It is called once per MTP depth; for depth > 1 the
incoming hidden states are the previous depth's output, so depth k's loss trains only depth k's
layer.

megatron-core main (0.20) scatters ``decoder_input`` to the sequence-parallel region inside the
method when the embedding skipped that scatter (``scatter_to_sequence_parallel=False``, multimodal
LMs). The detach here acts on what the method returns, after the scatter: the returned shard is cut
from the graph, so no gradient reaches the embedding through the scatter either (tested on 0.20 with
that branch taken).

A layer marked per model (``mtp_api.enable``/``disable`` set ``_patchkit_mtp_detach_inputs``)
follows its mark; an unmarked layer is detached (the process-wide patch is applied).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ._mtp_options import detach_inputs_for


def wrap_get_embeddings(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``. The return layout differs by release only before the last two items.

    0.14-0.17 return ``(input_ids, position_ids, decoder_input, hidden_states)``; 0.18+ insert
    ``padding_mask`` after ``position_ids``. ``decoder_input`` and ``hidden_states`` stay last.
    """

    @functools.wraps(original)
    def _get_embeddings(self, *args: Any, **kwargs: Any) -> tuple:
        outputs = original(self, *args, **kwargs)
        if not detach_inputs_for(self, default=True):
            return outputs
        *leading, decoder_input, hidden_states = outputs
        detached_hidden = hidden_states.detach().requires_grad_(hidden_states.requires_grad)
        return (*leading, decoder_input.detach(), detached_hidden)

    return _get_embeddings
