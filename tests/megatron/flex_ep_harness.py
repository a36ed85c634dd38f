"""DeepEP and HybridEP on CPU: stand-ins for the CUDA-only ``deep_ep`` buffers under megatron-core's flex dispatcher.

``MoEFlexTokenDispatcher`` (``moe_token_dispatcher_type='flex'``) moves tokens with DeepEP
(``deep_ep.Buffer``) or HybridEP (``deep_ep.HybridEPBuffer``), CUDA kernels with no CPU build.
megatron-core wraps them in its own autograd functions (``fused_a2a.FusedDispatch`` /
``FusedCombine``, ``HybridEPDispatch`` / ``HybridEPCombine``) and exports ``fused_dispatch``,
``hybrid_ep_dispatch``... only when ``deep_ep`` imports (``None`` otherwise). :func:`cpu_flex_ep`
stands in for exactly the library, inside its ``with`` block:

- ``fused_a2a.get_buffer(group, ...)`` returns a :class:`CpuDeepEPBuffer` and ``fused_a2a.HybridEPBuffer``
  (which upstream's ``init_hybrid_ep_buffer`` builds on the dispatcher's group) is
  :class:`CpuHybridEPBuffer`: the methods megatron-core calls, with DeepEP's results, computed with
  gloo collectives over that group (every rank gathers every rank's tokens and keeps those routed
  to its experts; combining scatters them back and sums over ranks). The module's buffer is reset
  before and after;
- ``fused_a2a.EventOverlap`` / ``EventHandle`` (DeepEP's CUDA events, used with ``async_finish``) do nothing;
- ``token_dispatcher.fused_dispatch`` / ``fused_combine`` / ``hybrid_ep_dispatch`` / ``hybrid_ep_combine``
  call upstream's own autograd functions (``FusedDispatch.apply``...) with their arguments in
  order, as upstream's wrappers do when ``deep_ep`` imports; ``set_deepep_num_sms`` does nothing;
- from 0.18 ``_HybridEPManager.__init__`` allocates its over-budget flag with ``device='cuda'``:
  ``token_dispatcher.torch`` allocates ``zeros`` on the CPU (every other name is torch's own).

The dispatcher, its managers, megatron-core's autograd functions, the experts and the collectives
are upstream's code, unchanged. DeepEP asserts TPxEP > 1, so the tests run two ranks (EP=2).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from patchkit.patches.megatron._checks._cpu_stand_in import _TorchWithCpuZeros

__all__ = ["CpuDeepEPBuffer", "CpuHybridEPBuffer", "cpu_flex_ep"]


def _gather_rows(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` (same shape on each), stacked along dim 0 in rank order."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts)


def _own_rows_of_sum(tensor: torch.Tensor, group: Any, num_local: int) -> torch.Tensor:
    """Sum ``tensor`` (rows of every rank's tokens) over ranks; this rank's ``num_local`` rows, a tensor of
    their own (as DeepEP returns: megatron-core adds the shared experts' output into it in place)."""
    dist.all_reduce(tensor, group=group)
    start = dist.get_rank(group) * num_local
    return tensor[start:start + num_local].clone()


class _Done:
    """DeepEP's event: everything on a CPU has finished when it returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def current_stream_wait(self) -> None:
        pass


class CpuDeepEPBuffer:
    """``deep_ep.Buffer``'s dispatch and combine for one group, on CPU.

    ``dispatch`` sends each token once to every rank that holds one of its top-k experts;
    ``recv_topk_idx`` names the expert by its local index there (-1: another rank's), and the
    handle remembers which of the group's tokens this rank received. ``combine`` sums each token's
    rows over the ranks that received it (the experts already weighted them by their probs).
    """

    def __init__(self, group: Any) -> None:
        self.group = group

    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, **_: Any) -> tuple[Any, ...]:
        world = dist.get_world_size(self.group)
        per_rank = num_experts // world
        valid = topk_idx >= 0
        in_rank = torch.stack([((topk_idx // per_rank == r) & valid).any(dim=1) for r in range(world)], dim=1)
        per_expert = torch.bincount(topk_idx[valid], minlength=num_experts)
        return in_rank.sum(dim=0), None, per_expert, in_rank, _Done()

    def dispatch(self, x: torch.Tensor, handle: Any = None, topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None, num_tokens_per_expert: torch.Tensor | None = None,
                 **_: Any) -> tuple[Any, ...]:
        rows = _gather_rows(x, self.group)
        if handle is not None:  # the backward of combine: the same tokens to the same ranks
            received, _ = handle
            return rows[received], None, None, None, handle, _Done()
        assert topk_idx is not None and topk_weights is not None and num_tokens_per_expert is not None
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        per_rank = num_tokens_per_expert.numel() // world
        indices, weights = _gather_rows(topk_idx, self.group), _gather_rows(topk_weights, self.group)
        local = (indices >= rank * per_rank) & (indices < (rank + 1) * per_rank)
        received = local.any(dim=1)
        recv_idx = torch.where(local, indices - rank * per_rank, torch.full_like(indices, -1))[received]
        recv_weights = torch.where(local, weights, torch.zeros_like(weights))[received]
        counts = torch.bincount(recv_idx[recv_idx >= 0], minlength=per_rank).tolist()
        return rows[received], recv_idx, recv_weights, counts, (received, x.shape[0]), _Done()

    def combine(self, x: torch.Tensor, handle: Any, topk_weights: torch.Tensor | None = None,
                **_: Any) -> tuple[Any, ...]:
        received, num_local = handle
        combined = self._scatter_sum(x, received, num_local)
        weights = None if topk_weights is None else self._scatter_sum(topk_weights, received, num_local)
        return combined, weights, _Done()

    def _scatter_sum(self, rows: torch.Tensor, received: torch.Tensor, num_local: int) -> torch.Tensor:
        full = rows.new_zeros((received.numel(), *rows.shape[1:]))
        full[received] = rows
        return _own_rows_of_sum(full, self.group, num_local)


class CpuHybridEPBuffer:
    """``deep_ep.HybridEPBuffer``'s permuting dispatch and combine, on CPU.

    ``dispatch_with_permute`` gathers every rank's tokens and lays out, expert by expert of this
    rank, the tokens routed to it with their prob; ``combine_with_unpermute`` adds each row back to
    its token and sums over ranks. The handle is the (group token, global expert) pair of each row.
    """

    def __init__(self, group: Any, **_: Any) -> None:
        self.group = group

    def dispatch_with_permute(self, hidden: torch.Tensor, routing_map: torch.Tensor | None = None,
                              probs: torch.Tensor | None = None, num_of_experts_per_rank: int | None = None,
                              handle: Any = None, **_: Any) -> tuple[Any, ...]:
        rows = _gather_rows(hidden, self.group)
        if handle is None:
            assert routing_map is not None and probs is not None and num_of_experts_per_rank is not None
            first = dist.get_rank(self.group) * num_of_experts_per_rank
            routed = _gather_rows(routing_map, self.group)[:, first:first + num_of_experts_per_rank]
            experts, tokens = routed.T.nonzero(as_tuple=True)  # expert-major, tokens in order
            handle = (tokens, experts + first, hidden.shape[0], routing_map.shape[1])
            dispatched_probs = _gather_rows(probs, self.group)[tokens, experts + first]
            tokens_per_expert = routed.sum(dim=0)
            return rows[tokens], dispatched_probs, None, tokens_per_expert, handle
        tokens = handle[0]
        return rows[tokens], None, None, None, handle

    def combine_with_unpermute(self, hidden: torch.Tensor, handle: Any, probs: torch.Tensor | None = None,
                               **_: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        tokens, experts, num_local, num_experts = handle
        world = dist.get_world_size(self.group)
        combined = hidden.new_zeros((world * num_local, hidden.shape[1])).index_add_(0, tokens, hidden)
        combined = _own_rows_of_sum(combined, self.group, num_local)
        combined_probs = None
        if probs is not None:
            full = probs.new_zeros((world * num_local, num_experts)).index_put_((tokens, experts), probs,
                                                                                accumulate=True)
            combined_probs = _own_rows_of_sum(full, self.group, num_local)
        return combined, combined_probs


def _applying(function: Any, contiguous_x: bool = False) -> Callable[..., Any]:
    """Call ``function.apply`` with the arguments bound to its ``forward``'s parameters, in order
    (what upstream's ``fused_dispatch``, ``hybrid_ep_dispatch``... do when ``deep_ep`` imports;
    ``fused_dispatch`` alone passes ``x.contiguous()``)."""
    signature = inspect.signature(function.forward)
    parameters = list(signature.parameters.values())[1:]  # ctx
    unbound = signature.replace(parameters=parameters)

    def call(*args: Any, **kwargs: Any) -> Any:
        bound = unbound.bind(*args, **kwargs)
        bound.apply_defaults()
        if contiguous_x:
            bound.arguments["x"] = bound.arguments["x"].contiguous()
        return function.apply(*bound.args)

    return call


@contextlib.contextmanager
def cpu_flex_ep() -> Iterator[None]:
    """DeepEP and HybridEP stand-ins (see the module docstring), undone on exit."""
    from megatron.core.transformer.moe import fused_a2a, token_dispatcher

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        patch(mock.patch.object(fused_a2a, "get_buffer", lambda group, hidden_bytes: CpuDeepEPBuffer(group)))
        patch(mock.patch.object(fused_a2a, "EventOverlap", _Done, create=True))
        patch(mock.patch.object(fused_a2a, "EventHandle", _Done, create=True))
        dispatch = _applying(fused_a2a.FusedDispatch, contiguous_x=True)
        patch(mock.patch.object(token_dispatcher, "fused_dispatch", dispatch))
        patch(mock.patch.object(token_dispatcher, "fused_combine", _applying(fused_a2a.FusedCombine)))
        patch(mock.patch.object(token_dispatcher, "set_deepep_num_sms", lambda num_sms: None))
        if hasattr(fused_a2a, "HybridEPDispatch"):  # 0.16 and later
            patch(mock.patch.object(fused_a2a, "HybridEPBuffer", CpuHybridEPBuffer, create=True))
            patch(mock.patch.object(fused_a2a, "_hybrid_ep_buffer", None))
            patch(mock.patch.object(token_dispatcher, "hybrid_ep_dispatch", _applying(fused_a2a.HybridEPDispatch)))
            patch(mock.patch.object(token_dispatcher, "hybrid_ep_combine", _applying(fused_a2a.HybridEPCombine)))
        patch(mock.patch.object(token_dispatcher, "torch", _TorchWithCpuZeros()))
        yield
