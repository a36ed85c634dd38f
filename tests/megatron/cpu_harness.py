"""Minimal harness that lets the real megatron-core run on CPU (gloo, world size 1).

Megatron-Core assumes a CUDA device in a handful of places that have nothing to do with what the
tests check. This harness redirects exactly those calls, and nothing else:

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

Everything is undone on exit. The model, the layers, the losses, autograd and the collectives
(gloo) are upstream's own code, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

__all__ = ["cpu_megatron", "destroy_parallel_state", "free_port", "initialize_parallel_state"]


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
        yield


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def initialize_parallel_state(seed: int = 1234, **model_parallel_kwargs: Any) -> None:
    """Start a gloo process group of one rank and Megatron's parallel state on top of it.

    Call inside ``cpu_megatron()``: seeding the model-parallel RNG tracker touches the CUDA RNG.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(free_port())
        torch.distributed.init_process_group(backend="gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(**model_parallel_kwargs)
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel_state() -> None:
    """Tear down Megatron's parallel state and the process group started above."""
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
