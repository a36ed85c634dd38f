"""Megatron-Core on a CPU: the stand-ins for its CUDA-only calls, for self-checks and tests.

``patchkit doctor`` runs the Megatron patches' self-checks on the CPU when no GPU is there, and the
test suite runs the same checks in CPU CI. Megatron-Core assumes a CUDA device in a handful of places
that have nothing to do with what the checks prove; :func:`cpu_megatron` and :func:`cpu_moe`
redirect exactly those, only inside their ``with`` block, and undo everything on exit. On a GPU
neither is used.

:func:`cpu_megatron`:

- ``torch.cuda.current_device`` returns ``"cpu"``: ``GlobalMemoryBuffer.get_tensor`` (used by the
  local dot-product attention) and some layers allocate with ``device=torch.cuda.current_device()``.
- ``torch.cuda.get_rng_state`` / ``torch.cuda.manual_seed`` and
  ``megatron.core.tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` read and
  write a dedicated CPU ``torch.Generator`` standing in for the CUDA default generator: Megatron's
  RNG tracker (``model_parallel_cuda_manual_seed``, ``CudaRNGStatesTracker.add`` / ``fork``) keeps
  per-parallel-group CUDA RNG states and would otherwise call into the CUDA driver. The stand-in is
  separate from the CPU default generator, so forking it never disturbs CPU randomness (which is
  what weight initialisation with ``use_cpu_initialization=True`` and CPU dropout draw from).
  Consequence: dropout inside a tracker fork is not reproduced bit-for-bit as on GPU; tests that
  compare numbers run with dropout 0.
- ``torch.cuda.current_stream`` returns a do-nothing stream: from megatron-core 0.19,
  ``DistributedDataParallel``'s grad sync (``_ParamAndGradBucketGroup.start_grad_sync``, reached by
  ``finish_grad_sync``) takes the current CUDA stream unconditionally, to wait on the events a local
  CUDA-graph replay leaves on parameters. There are no CUDA graphs on a CPU, so it waits on nothing;
  without the stand-in the first call initialises CUDA ("Found no NVIDIA driver").

:func:`cpu_moe` (MoE layers, inside :func:`cpu_megatron`):

- ``torch.cuda.Stream`` and ``torch.cuda.stream`` return / enter a do-nothing stream (and
  ``torch.cuda.current_stream`` the same one). ``MoEAlltoAllTokenDispatcher`` creates a side stream
  for its device-to-host copies in ``__init__`` and enters it in ``_maybe_dtoh_and_synchronize``; on
  CPU those copies are plain tensor moves and need no stream. The class-level ``cuda_dtoh_stream`` it caches is
  restored on exit, so no dummy outlives the block.
- ``moe_utils.torch`` reads through to ``torch`` except that ``zeros(..., device=...)`` allocates on
  the CPU: 0.14-0.16's ``track_moe_metrics(force_initialize=True)`` creates its tracker entries with
  ``device="cuda"`` (a literal, not the current device). Every other ``torch`` name is torch's own.
- ``moe_utils.te_general_gemm`` is set to ``None``: ``RouterGatingLinearFunction`` reads this
  module global, which megatron-core defines only when TransformerEngine imports (0.15 raises
  ``NameError`` without it, 0.16.1 calls into TE); ``None`` selects upstream's own torch matmul path.

The model, the layers, routing, dispatch, the losses, autograd and the collectives (gloo) are upstream's
own code, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

__all__ = ["cpu_megatron", "cpu_moe", "destroy_parallel_state", "initialize_parallel_state"]


class _DeviceRNG:
    """A CPU generator that plays the role of the (absent) CUDA default generator."""

    def __init__(self) -> None:
        self.generator = torch.Generator(device="cpu")

    def get_state(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.generator.get_state()

    def set_state(self, new_state: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.generator.set_state(new_state)

    def manual_seed(self, seed: int) -> None:
        self.generator.manual_seed(int(seed))


@contextlib.contextmanager
def cpu_megatron() -> Iterator[None]:
    """Redirect Megatron's CUDA-only device and RNG calls to CPU for the duration of the block."""
    from megatron.core.tensor_parallel import random as megatron_random

    rng = _DeviceRNG()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: "cpu"))
        stack.enter_context(mock.patch.object(torch.cuda, "get_rng_state", rng.get_state))
        stack.enter_context(mock.patch.object(torch.cuda, "manual_seed", rng.manual_seed))
        stack.enter_context(
            mock.patch.object(megatron_random, "_get_cuda_rng_state", rng.get_state)
        )
        stack.enter_context(
            mock.patch.object(megatron_random, "_set_cuda_rng_state", rng.set_state)
        )
        stack.enter_context(mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: _Stream()))
        yield


def initialize_parallel_state(seed: int = 1234, **model_parallel_kwargs: Any) -> None:
    """Start a gloo process group of one rank and Megatron's parallel state on top of it.

    Call inside ``cpu_megatron()``: seeding the model-parallel RNG tracker touches the CUDA RNG.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not torch.distributed.is_initialized():
        # A group of one on an in-memory store: no port to pick first and lose to another process.
        torch.distributed.init_process_group(backend="gloo", store=torch.distributed.HashStore(), rank=0,
                                             world_size=1)
    parallel_state.initialize_model_parallel(**model_parallel_kwargs)
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel_state() -> None:
    """Tear down Megatron's parallel state and the process group started above."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class _Event:
    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass


class _Stream:
    """Stands in for a CUDA stream; every stream is the same one, as on a single CPU queue."""

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return _Event()

    def synchronize(self) -> None:
        pass

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


class _TorchWithCpuZeros:
    """``torch`` for ``moe_utils``, with ``zeros`` allocating on the CPU whatever device is named."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def zeros(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **kwargs)


@contextlib.contextmanager
def cpu_moe() -> Iterator[None]:
    """Apply the MoE redirections above; use inside :func:`cpu_megatron`."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    stream = _Stream()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "Stream", lambda *a, **k: stream))
        stack.enter_context(mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: stream))
        stack.enter_context(mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()))
        stack.enter_context(mock.patch.object(moe_utils, "torch", _TorchWithCpuZeros()))
        stack.enter_context(mock.patch.object(moe_utils, "te_general_gemm", None, create=True))
        stack.enter_context(
            mock.patch.object(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
        )
        yield
