"""MoE additions to ``cpu_harness``: what megatron-core's MoE layer needs to run on CPU.

Redirects exactly these, and only inside ``cpu_moe()``:

- ``torch.cuda.Stream``, ``torch.cuda.current_stream`` and ``torch.cuda.stream`` return / enter a
  do-nothing stream. ``MoEAlltoAllTokenDispatcher`` creates a side stream for its device-to-host
  copies in ``__init__`` and enters it in ``_maybe_dtoh_and_synchronize``; on CPU those copies are
  plain tensor moves and need no stream. The class-level ``cuda_dtoh_stream`` it caches is
  restored on exit, so no dummy outlives the block.
- ``moe_utils.te_general_gemm`` is set to ``None``: ``RouterGatingLinearFunction`` reads this
  module global, which megatron-core defines only when TransformerEngine imports (0.15 raises
  ``NameError`` without it, 0.16.1 calls into TE); ``None`` selects upstream's own torch matmul path.

Routing, dispatch, permutation and the experts are upstream's code, unchanged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

__all__ = ["cpu_moe"]


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


@contextlib.contextmanager
def cpu_moe() -> Iterator[None]:
    """Apply the MoE redirections above; use inside ``cpu_harness.cpu_megatron()``."""
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    stream = _Stream()
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "Stream", lambda *a, **k: stream))
        stack.enter_context(mock.patch.object(torch.cuda, "current_stream", lambda *a, **k: stream))
        stack.enter_context(mock.patch.object(torch.cuda, "stream", lambda s: contextlib.nullcontext()))
        stack.enter_context(mock.patch.object(moe_utils, "te_general_gemm", None, create=True))
        stack.enter_context(
            mock.patch.object(MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", None)
        )
        yield
