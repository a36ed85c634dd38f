"""``MultiTokenPredictionLayer._get_embeddings`` with the MTP block's inputs from the main model cut.

Derived from upstream ``MultiTokenPredictionLayer._get_embeddings`` (megatron-core 0.14-0.19 and
main 0.20), which rolls the token/position ids, embeds them with the main model's embedding and
returns the embeddings (``decoder_input``) and the incoming hidden states as the MTP layer's
inputs. What changes, with upstream 0.19's ``mtp_detach_heads`` as the reference for where the cut
goes:

- ``decoder_input`` is detached at every depth: it comes from the main model's embedding;
- the incoming hidden states are detached only where they come from the main model, i.e. at the
  first depth the block runs (0.19 detaches ``hidden_states_list[offset]`` once, in
  ``MultiTokenPredictionBlock.forward``). At depth k > 1 they are depth k-1's output, so depth k's
  loss still trains the earlier MTP layers, as upstream's own option lets it.

So the MTP loss trains the MTP layers (and, through the shared output head, the output layer
unless the postprocess patch detaches it) but sends no gradient into the embedding or the decoder.
The hidden states keep their ``requires_grad`` flag, because activation recomputation needs one
input that requires grad to produce a differentiable output (upstream 0.19 does the same).

Which depth a call serves is read from the ids it is given: every depth rolls ``input_ids`` and
hands the rolled ids to the next depth (the block's loop and the fine-grained schedule's
``chunk_state`` alike), so the ids this wrapper returns are marked, and a call given marked ids is
inside the chain. Ids not returned by an MTP layer (the batch's own, or those of a previous
pipeline stage) start it, where 0.19 detaches too. This holds with upstream's repeated MTP layer
(0.19's ``mtp_use_repeated_layer``: one layer object for every depth) where a layer's own number
would not.

megatron-core main (0.20) scatters ``decoder_input`` to the sequence-parallel region inside the
method when the embedding skipped that scatter (``scatter_to_sequence_parallel=False``, multimodal
LMs). The detach here acts on what the method returns, after the scatter: the returned shard is cut
from the graph, so no gradient reaches the embedding through the scatter either (tested on 0.20 with
that branch taken).

A layer marked per model (``mtp.enable``/``disable`` set ``_patchkit_mtp_detach_inputs``)
follows its mark; an unmarked layer is detached (the process-wide patch is applied).

``position_ids=None`` (a RoPE model's forward, as slime's and ROLL's RL forwards call it): upstream
0.14-0.18 roll ``position_ids`` unconditionally and fail on None; 0.19's ``roll_tensor`` returns
None for None (slime's Megatron patch skips the roll instead). On a release that fails, this
wrapper hands the method the ids themselves in place of the absent positions, to roll and give the
embedding, and returns None in their place, so every depth sees None as on 0.19. It does so only
for an embedding that adds no position embedding (``add_position_embedding`` False: RoPE or none),
which never reads them; an embedding that would read them is left to upstream, which fails as before.
This holds whether or not the layer detaches its inputs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ._options import detach_inputs_for

#: Attribute set on the rolled ``input_ids`` an MTP layer returns: the next depth is in the chain.
ROLLED_BY_MTP = "_patchkit_rolled_by_mtp"


def _given_ids(args: tuple, kwargs: dict[str, Any]) -> Any:
    return kwargs["input_ids"] if "input_ids" in kwargs else (args[0] if args else None)


# _get_embeddings(self, input_ids, position_ids, embedding, hidden_states, ...) on every release.
_POSITION_IDS, _EMBEDDING = 1, 2


def _argument(args: tuple, kwargs: dict[str, Any], name: str, index: int) -> Any:
    return kwargs[name] if name in kwargs else (args[index] if len(args) > index else None)


@functools.cache
def _release_rolls_none() -> bool:
    """Whether the installed ``roll_tensor`` returns None for None (0.19+), as ``_get_embeddings`` then needs."""
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    try:
        return roll_tensor(None)[0] is None
    except (TypeError, AttributeError):  # torch.roll(None, ...): 0.14-0.18
        return False


def _stand_in_positions(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    """The call with the ids standing in for absent ``position_ids``, or None where it is not needed."""
    if _argument(args, kwargs, "position_ids", _POSITION_IDS) is not None or _release_rolls_none():
        return None
    embedding = _argument(args, kwargs, "embedding", _EMBEDDING)
    if getattr(embedding, "add_position_embedding", True):  # it would read them: upstream decides
        return None
    stand_in = _given_ids(args, kwargs)
    if "position_ids" in kwargs or len(args) <= _POSITION_IDS:
        return args, {**kwargs, "position_ids": stand_in}
    return (*args[:_POSITION_IDS], stand_in, *args[_POSITION_IDS + 1:]), kwargs


def wrap_get_embeddings(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``. The return layout differs by release only before the last two items.

    0.14-0.17 return ``(input_ids, position_ids, decoder_input, hidden_states)``; 0.18+ insert
    ``padding_mask`` after ``position_ids``. ``input_ids`` stays first, ``decoder_input`` and
    ``hidden_states`` last.
    """

    @functools.wraps(original)
    def _get_embeddings(self, *args: Any, **kwargs: Any) -> tuple:
        standing_in = _stand_in_positions(args, kwargs)
        if standing_in is None:
            outputs = original(self, *args, **kwargs)
        else:
            rolled, _, *rest = original(self, *standing_in[0], **standing_in[1])
            outputs = (rolled, None, *rest)
        if not detach_inputs_for(self, default=True):
            return outputs
        given_ids = _given_ids(args, kwargs)
        rolled_ids, *middle, decoder_input, hidden_states = outputs
        if rolled_ids is not None and rolled_ids is not given_ids:  # never mark the batch's own ids
            setattr(rolled_ids, ROLLED_BY_MTP, True)
        if not getattr(given_ids, ROLLED_BY_MTP, False):  # the first depth: inputs from the main model
            hidden_states = hidden_states.detach().requires_grad_(hidden_states.requires_grad)
        return (rolled_ids, *middle, decoder_input.detach(), hidden_states)

    return _get_embeddings
