"""The public errors of the Megatron-Core patches and their helpers: every one a ``patchkit.PatchkitError``.

A leaf module: it imports nothing from the family, so every module of it (and a caller catching
one of these) can import it without pulling in torch, Megatron or another module of the family.
The family packages export them with their public API (``patchkit.patches.megatron.router_replay``,
``patchkit.patches.megatron.mtp``).
"""

from __future__ import annotations

from typing import Any, Optional

from patchkit.runtime.errors import PatchkitError


class RouterReplayError(PatchkitError, RuntimeError):
    """Router replay was asked for something the current model or data cannot do."""



class PackedShapeError(RouterReplayError, ValueError):
    """A packed index tensor whose shape does not fit the :class:`ThdLayout` it is used with."""



class RouterReplayUnavailableError(RouterReplayError):
    """No MoE router of this process has replay state (not enabled, or the patch not applied)."""



class ReplayTargetMissingError(RouterReplayError):
    """A router was told to replay but has no indices queued for this pass."""



class RouterReplayConflictError(RouterReplayError):
    """Another framework's replay patch owns the routers; patchkit's API stands aside."""



class ReplayIndexInvalidError(RouterReplayError, ValueError):
    """Replayed rows hold expert indices outside ``[0, num_experts)`` (e.g. the ``-1`` sentinel)."""

    def __init__(
        self, *, layer: Any, rows: int, tokens: int, num_experts: int, action: str = "", example: Any = None
    ) -> None:
        self.layer = layer
        self.rows = rows
        self.tokens = tokens
        self.num_experts = num_experts
        super().__init__(
            f"MoE layer {layer}" + (f" ({action})" if action else "") + f": {rows} of {tokens} replayed rows "
            f"hold expert indices outside [0, {num_experts}) (first such row: {example}); rollout engines "
            "write -1 for tokens they have no routing for. Fix the rows, or set_policy(on_invalid='native') "
            "to let the router choose for them"
        )



class ReplayIndexMismatchError(RouterReplayError, ValueError):
    """Replayed indices do not have one row of ``topk`` experts per token the router sees."""

    def __init__(
        self,
        *,
        layer: Any,
        expected_tokens: int,
        got_tokens: int,
        topk: Optional[int] = None,
        got_shape: tuple[int, ...] = (),
        action: str = "",
    ) -> None:
        self.layer = layer
        self.expected_tokens = expected_tokens
        self.got_tokens = got_tokens
        self.topk = topk
        self.got_shape = got_shape
        where = f"MoE layer {layer}" + (f" ({action})" if action else "")
        shape = f" [{expected_tokens}, {topk}]" if topk is not None else ""
        super().__init__(
            f"{where}: the router sees {expected_tokens} tokens but the replay target has "
            f"{got_tokens} (shape {list(got_shape)}, expected{shape}); pack the per-sample "
            "indices with the same THD padding (FP8 / TP / CP alignment) as the model input"
        )



class MTPOptionError(PatchkitError, ValueError):
    """An MTP option was given a value it does not take."""



class MTPRecomputeError(PatchkitError, RuntimeError):
    """Activation recomputation of an MTP layer was asked for in a form this release cannot run."""



class MTPModelError(PatchkitError, TypeError):
    """``enable``/``disable`` was given something that holds no megatron ``GPTModel``."""



class RoutingReplayKeywordConflict(PatchkitError, ValueError):
    """``enable_routing_replay`` and ``moe_enable_routing_replay`` were both given, with different values."""

    def __init__(self, keyword: Any, field: Any) -> None:
        self.keyword = keyword
        self.field = field
        super().__init__(
            f"TransformerConfig got enable_routing_replay={keyword!r} and moe_enable_routing_replay={field!r}; "
            "they are one switch (enable_routing_replay is the older name): pass one of them"
        )



class MlaRopeTableError(PatchkitError, RuntimeError):
    """MLA's RoPE table, cut short for packed sequences under context parallelism, cannot be rebuilt."""

    def __init__(self, rows: int, needed: int, reason: str) -> None:
        self.rows = rows
        self.needed = needed
        super().__init__(
            f"MLA's RoPE table has {rows} rows, the longest packed sequence needs {needed} under context "
            f"parallelism, and it cannot be extended: {reason}. Set MLATransformerConfig.context_parallel_size "
            "to the size of the context-parallel group the model runs with"
        )



class DistCheckpointingError(PatchkitError, RuntimeError):
    """A distributed-checkpointing patch met upstream code in a shape it was not written for."""



class AsyncCallsPendingError(DistCheckpointingError):
    """``AsyncCallsQueue.reset()`` was asked to drop checkpoint saves that have not been finalised."""

    def __init__(self, pending: int) -> None:
        self.pending = pending
        super().__init__(
            f"the async checkpoint queue still has {pending} unfinalised save(s): finalise them first "
            "(maybe_finalize_async_calls(blocking=True) on every rank), or reset(abandon=True) to drop them "
            "(their checkpoints are then incomplete)"
        )



class HadamardInputError(PatchkitError, ValueError):
    """A tensor the Hadamard transform does not take: the CUDA kernel it stands in for rejects it too."""

    def __init__(self, shape: tuple[int, ...], dtype: Any, reason: str) -> None:
        self.shape = shape
        self.dtype = dtype
        super().__init__(
            f"hadamard_transform got a tensor of shape {list(shape)} and dtype {dtype}: {reason}. "
            "fast_hadamard_transform, whose signature and limits the fallback keeps, takes float32, "
            "float16 or bfloat16 with a last dimension of 1 to 32768"
        )


class BufferRegionError(PatchkitError, ValueError):
    """DDP buffers without CPU backup were asked for where they cannot be had: with ``nccl_ub`` (the
    buffers then come from NCCL's own memory pool, which torch_memory_saver cannot pause)."""


class TorchMemorySaverMissingError(PatchkitError, ImportError):
    """DDP buffers without CPU backup were asked for, but torch_memory_saver does not import."""


class BufferAllocationMismatchError(PatchkitError, RuntimeError):
    """``_ParamAndGradBuffer`` allocated its buffers other than the release's code does (a build of
    megatron-core that changed the allocation block): no buffer is left in the wrong region silently."""


class BufferRegionsUnavailableError(PatchkitError, RuntimeError):
    """``memory.buffers_without_cpu_backup()`` was used while ``megatron.ddp_buffers_without_cpu_backup``
    is not installed: the DDPs built in the block would keep their CPU backup."""
