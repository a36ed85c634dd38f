"""The dispatchers' ``combine_postprocess`` for megatron-core 0.14-0.19: upstream's, then the probs dropped.

``MoEAlltoAllTokenDispatcher`` reads ``self.probs`` in ``combine_preprocess`` (its dtype, for the
tensor-parallel reduce-scatter) and ``MoEAllGatherTokenDispatcher`` reads ``self.local_probs`` in
``token_combine`` (the same); both run before ``combine_postprocess``, the last step of a
layer's dispatch and combine. Autograd keeps what backward needs on its own, so once the tokens
are combined the dispatcher's reference only keeps the graph alive: under full recompute, the one
built inside ``CheckpointFunction.backward``, with the checkpoint's input and its gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def _dropping_after_combine(original: Callable[..., Any], attribute: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def combine_postprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, *args, **kwargs)
        # Combined: the probs were read for their dtype only. Keeping them would keep a
        # recomputed forward's graph (its checkpointed input and gradient) alive until the
        # next forward sets them again.
        setattr(self, attribute, None)
        return output

    return combine_postprocess


def wrap_alltoall_combine_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEAlltoAllTokenDispatcher.combine_postprocess`` that drops ``self.probs`` after combining."""
    return _dropping_after_combine(original, "probs")


def wrap_allgather_combine_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEAllGatherTokenDispatcher.combine_postprocess`` that drops ``self.local_probs`` after combining
    (read by ``token_combine`` for their dtype only, as the all-to-all dispatcher's probs)."""
    return _dropping_after_combine(original, "local_probs")
