"""The dispatchers' ``combine_postprocess`` for megatron-core 0.14-0.19: upstream's, then the step's tensors dropped.

``combine_postprocess`` is the last step of a layer's dispatch and combine: every tensor a dispatcher
kept from its dispatch has been read by then. ``MoEAlltoAllTokenDispatcher`` reads ``self.probs``
in ``combine_preprocess`` (its dtype, for the tensor-parallel reduce-scatter) and
``MoEAllGatherTokenDispatcher`` reads ``self.local_probs`` in ``token_combine`` (the same); their
routing maps and ``reversed_local_input_permutation_mapping`` are read by ``unpermute`` in
``combine_preprocess`` (all-gather) or ``combine_postprocess`` (all-to-all). The flex dispatcher's
communication manager (DeepEP, HybridEP, NCCL EP) keeps its top-k probs and indices, the
dispatched probs, indices and routing map, the permutation mapping and the token counts, all read
before or inside ``combine``.

Autograd keeps what backward needs on its own, so once the tokens are combined the dispatcher's
references only keep memory alive: under full recompute, through the probs, the graph built inside
``CheckpointFunction.backward`` with the checkpoint's input and its gradient; the maps and mappings
as plain tensors. Every one of them is set again by the next forward before it is read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

#: What each dispatcher keeps from one dispatch and reads for the last time while combining
#: (``routing_map`` and ``reversed_local_input_permutation_mapping`` are the ones NeMo-RL clears too).
ALLTOALL_STEP_TENSORS = ("probs", "routing_map", "reversed_local_input_permutation_mapping")
ALLGATHER_STEP_TENSORS = ("local_probs", "local_map", "reversed_local_input_permutation_mapping")

#: The flex dispatcher's communication managers, by class name, and what each keeps from one dispatch.
#: ``tokens_per_expert`` is set again by every dispatch (HybridEP's drop-and-pad mode: by every
#: ``setup_metadata``) before ``dispatch_postprocess`` reads it. Persistent state (buffers, the
#: HybridEP capacity and over-budget flag, drop-and-pad's ``num_permuted_tokens``) is left alone.
DEEPEP_STEP_TENSORS = ("token_probs", "token_indices", "dispatched_indices", "dispatched_probs",
                       "dispatched_routing_map", "reversed_mapping_for_combine", "pad_offsets",
                       "tokens_per_expert")
HYBRIDEP_STEP_TENSORS = ("token_probs", "routing_map", "dispatched_probs", "tokens_per_expert")
NCCLEP_STEP_TENSORS = ("token_probs", "token_indices", "dispatched_probs", "tokens_per_expert")

#: Managers by release: DeepEP from 0.14, HybridEP from 0.16, NCCL EP from 0.19.
FLEX_MANAGERS_V014: Mapping[str, tuple[str, ...]] = {"_DeepepManager": DEEPEP_STEP_TENSORS}
FLEX_MANAGERS_V016: Mapping[str, tuple[str, ...]] = {**FLEX_MANAGERS_V014, "_HybridEPManager": HYBRIDEP_STEP_TENSORS}
FLEX_MANAGERS_V019: Mapping[str, tuple[str, ...]] = {**FLEX_MANAGERS_V016, "_NCCLEPManager": NCCLEP_STEP_TENSORS}


def release_tensors(owner: Any, names: tuple[str, ...]) -> None:
    """Set each of ``owner``'s attributes in ``names`` that holds a tensor to ``None`` (others untouched)."""
    import torch

    for name in names:
        if isinstance(getattr(owner, name, None), torch.Tensor):
            setattr(owner, name, None)


def _releasing_after_combine(original: Callable[..., Any], release: Callable[[Any], None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def combine_postprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = original(self, *args, **kwargs)
        # Combined: everything kept from this dispatch has been read. Keeping it would keep a
        # recomputed forward's graph (its checkpointed input and gradient) alive until the next
        # forward sets it again.
        release(self)
        return output

    return combine_postprocess


def wrap_alltoall_combine_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEAlltoAllTokenDispatcher.combine_postprocess`` that drops ``probs``, the routing map and the
    permutation mapping after combining."""
    return _releasing_after_combine(original, lambda self: release_tensors(self, ALLTOALL_STEP_TENSORS))


def wrap_allgather_combine_postprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEAllGatherTokenDispatcher.combine_postprocess`` that drops ``local_probs``, ``local_map`` and the
    permutation mapping after combining (``local_probs`` read by ``token_combine`` for their dtype only)."""
    return _releasing_after_combine(original, lambda self: release_tensors(self, ALLGATHER_STEP_TENSORS))


def _flex_release(managers: Mapping[str, tuple[str, ...]]) -> Callable[[Any], None]:
    def release(dispatcher: Any) -> None:
        manager = getattr(dispatcher, "_comm_manager", None)
        names = managers.get(type(manager).__name__)
        if names is not None:
            release_tensors(manager, names)

    return release


def wrap_flex_combine_postprocess_v014(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEFlexTokenDispatcher.combine_postprocess`` (0.14-0.15, DeepEP) that drops the manager's step tensors."""
    return _releasing_after_combine(original, _flex_release(FLEX_MANAGERS_V014))


def wrap_flex_combine_postprocess_v016(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEFlexTokenDispatcher.combine_postprocess`` (0.16-0.18, DeepEP and HybridEP) that drops the
    manager's step tensors."""
    return _releasing_after_combine(original, _flex_release(FLEX_MANAGERS_V016))


def wrap_flex_combine_postprocess_v019(original: Callable[..., Any]) -> Callable[..., Any]:
    """``MoEFlexTokenDispatcher.combine_postprocess`` (0.19, DeepEP, HybridEP and NCCL EP) that drops the
    manager's step tensors."""
    return _releasing_after_combine(original, _flex_release(FLEX_MANAGERS_V019))
