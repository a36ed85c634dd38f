"""Tensor-parallel gradients to all-reduce, for the chunked all-reduce's self-check and tests.

:func:`tp_model` is a model chunk as ``finalize_model_grads`` receives it from megatron-core's DDP:
``ddp_config`` and parameters carrying ``main_grad``, marked as megatron-core's layers mark them
(``sequence_parallel`` on layer norms, ``average_gradients_across_tp_domain``), q/k layer norms named as
upstream names them, and a tensor-parallel weight that is not all-reduced. Each rank's gradients are
its own (:func:`rank_grad`), so what a rank holds after the all-reduce is known in advance
(:func:`expected_grads`).

:func:`recording_all_reduces` records the bytes every ``torch.distributed.all_reduce`` carries, and
:func:`thread_pair` runs two tensor-parallel ranks as two threads of one process, each with its own
gloo group over an in-memory store (no port, no file), for ``patchkit doctor``.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

HIDDEN = 16
LAYERS = 4
#: Each bound, in bytes, holds one layer's reduced gradients (a 64-byte norm, two 32-byte q/k
#: norms, a 256-byte router) at most: a 256-byte chunk forces several all-reduces per op.
CHUNK_BYTES = 256
#: How long one rank of :func:`thread_pair` waits for the other, in a collective or at the end.
PAIR_TIMEOUT = datetime.timedelta(seconds=60)


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = torch.nn.LayerNorm(HIDDEN)
        self.q_layernorm = torch.nn.LayerNorm(HIDDEN // 2, bias=False)
        self.k_layernorm = torch.nn.LayerNorm(HIDDEN // 2, bias=False)
        self.linear_qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN // 2, bias=False)  # this rank's shard
        self.router = torch.nn.Linear(HIDDEN, 4, bias=False)
        for norm in self.input_layernorm.parameters():
            norm.sequence_parallel = True
        self.router.weight.average_gradients_across_tp_domain = True


class _ModelChunk(torch.nn.Module):
    def __init__(self, ddp_config: Any) -> None:
        super().__init__()
        self.ddp_config = ddp_config
        self.layers = torch.nn.ModuleList(_Layer() for _ in range(LAYERS))


def rank_grad(rank: int, index: int, shape: torch.Size) -> torch.Tensor:
    """Rank ``rank``'s gradient of the ``index``-th parameter: distinct per rank and parameter."""
    generator = torch.Generator().manual_seed(1000 * rank + index)
    return torch.randn(shape, generator=generator)


def tp_model(rank: int) -> list[Any]:
    """``[model_chunk]`` with every parameter's ``main_grad`` set to rank ``rank``'s gradient."""
    from megatron.core.distributed import DistributedDataParallelConfig

    torch.manual_seed(0)
    model = _ModelChunk(DistributedDataParallelConfig())
    for index, param in enumerate(model.parameters()):
        param.main_grad = rank_grad(rank, index, param.shape)
    return [model]


def tp_config() -> Any:
    """A transformer config with sequence parallelism and q/k layer norms, TP=2."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=2,
                             tensor_model_parallel_size=2, sequence_parallel=True, qk_layernorm=True)


def expected_grads(rank: int, world_size: int = 2) -> dict[str, torch.Tensor]:
    """Each parameter's gradient on rank ``rank`` after the tensor-parallel all-reduce: the sum over
    ranks for norms, the mean for averaged parameters, its own for tensor-parallel shards."""
    expected = {}
    for index, (name, param) in enumerate(tp_model(rank)[0].named_parameters()):
        every = [rank_grad(other, index, param.shape) for other in range(world_size)]
        if getattr(param, "average_gradients_across_tp_domain", False):
            expected[name] = torch.stack(every).mean(0)
        elif getattr(param, "sequence_parallel", False) or "q_layernorm" in name or "k_layernorm" in name:
            expected[name] = torch.stack(every).sum(0)
        else:
            expected[name] = every[rank]
    return expected


def grads(model: list[Any]) -> dict[str, torch.Tensor]:
    """Every parameter's ``main_grad``, by name."""
    return {name: param.main_grad for name, param in model[0].named_parameters()}


@contextlib.contextmanager
def recording_all_reduces() -> Iterator[list[int]]:
    """The bytes of every ``torch.distributed.all_reduce`` in the block, in call order."""
    carried: list[int] = []
    all_reduce = torch.distributed.all_reduce

    def recording(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        carried.append(tensor.numel() * tensor.element_size())
        return all_reduce(tensor, *args, **kwargs)

    with mock.patch.object(torch.distributed, "all_reduce", recording):
        yield carried


def thread_pair(function: Callable[[int, Any], Any]) -> list[Any]:
    """``function(rank, group)`` for ranks 0 and 1 in two threads, each with its own two-rank gloo
    group over one in-memory store; their return values by rank. Needs a default process group (a
    one-rank one will do). A rank that raises fails the pair; a rank stuck past :data:`PAIR_TIMEOUT`
    (its peer gone) fails in its collective, bounded by the group's timeout."""
    store = torch.distributed.HashStore()
    results: dict[int, tuple[bool, Any]] = {}

    def run(rank: int) -> None:
        try:
            group = torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore("tp", store), rank, 2,
                                                       PAIR_TIMEOUT)
            results[rank] = (True, function(rank, group))
        except BaseException as exc:  # noqa: BLE001 - reported below, with the rank
            results[rank] = (False, exc)

    threads = [threading.Thread(target=run, args=(rank,), name=f"tp-rank-{rank}", daemon=True) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(2 * PAIR_TIMEOUT.total_seconds())
    for rank in (0, 1):
        if rank not in results:
            raise TimeoutError(f"tensor-parallel rank {rank} did not finish within {2 * PAIR_TIMEOUT}")
        ok, value = results[rank]
        if not ok:
            raise value
    return [results[0][1], results[1][1]]
