"""``MultiTokenPredictionLayer._checkpointed_forward`` that accepts non-tensor arguments (0.14-0.17).

Upstream 0.14-0.17 hand every keyword argument of the MTP layer's recomputed forward to the
checkpoint primitive positionally (``tensor_parallel.checkpoint(f, distribute, *args,
*kwargs.values())``). ``CheckpointFunction`` stores them with ``save_for_backward``, which takes only
tensors and ``None``: with ``recompute_granularity='full'`` and packed sequences (0.16+ let
``packed_seq_params`` reach the MTP layer) the forward raises ``TypeError: save_for_backward can
only save variables, but argument 10 is of type PackedSeqParams``. On the fp8 path
(``te_checkpoint``) the tensors travel as keywords, which TransformerEngine's reentrant checkpoint
does not track as inputs (upstream's own 0.18 comment on this method).

What changes: tensor and ``None`` arguments go to the original ``_checkpointed_forward``
positionally; every other argument (``packed_seq_params``, ``inference_params``, any object) is
captured by the function it checkpoints, as upstream 0.18 does in its rewrite. The original still
chooses the checkpoint primitive and the recompute method, so nothing else differs.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from torch import Tensor


def _travels_through_checkpoint(value: Any) -> bool:
    return value is None or isinstance(value, Tensor)


def wrap_checkpointed_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Factory for ``Wrap``: split tensor from non-tensor arguments around ``original``."""

    @functools.wraps(original)
    def _checkpointed_forward(self, forward_func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        positional = [(index, value) for index, value in enumerate(args)]
        keyword = list(kwargs.items())
        tensor_slots = [slot for slot, value in positional + keyword if _travels_through_checkpoint(value)]
        captured = {slot: value for slot, value in positional + keyword if not _travels_through_checkpoint(value)}
        def forward_with_captured(*tensors: Any) -> Any:
            given = dict(zip(tensor_slots, tensors, strict=True)) | captured
            call_args = [given[index] for index in range(len(args))]
            call_kwargs = {name: given[name] for name in kwargs}
            return forward_func(*call_args, **call_kwargs)

        values = dict(positional + keyword)
        return original(self, forward_with_captured, *(values[slot] for slot in tensor_slots))

    return _checkpointed_forward
