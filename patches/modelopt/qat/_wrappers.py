"""Find the model inside the wrappers training engines put around their chunks.

Megatron wraps each chunk in ``DistributedDataParallel`` (or FSDP) around ``Float16Module``; RL
frameworks add their own wrappers with a ``.module`` attribute. ModelOpt must convert the bare
model (its quantizer names then start at the model root, where ignore patterns and exporters look),
while the caller keeps the wrapper objects: quantizers are inserted into the wrapped model in place.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def _known_wrapper_types() -> tuple[type, ...]:
    """Megatron's and torch's wrapper classes that are importable here."""
    types: list[type] = [nn.parallel.DistributedDataParallel]
    try:
        from megatron.core.distributed import DistributedDataParallel
        from megatron.core.transformer.module import Float16Module

        types += [DistributedDataParallel, Float16Module]
    except ImportError:  # no megatron-core: only torch's and generic wrappers
        pass
    try:
        from megatron.core.distributed import TorchFullyShardedDataParallel

        types.append(TorchFullyShardedDataParallel)
    except ImportError:
        pass
    return tuple(types)


def data_parallel_types() -> tuple[type, ...]:
    """Wrappers that captured the parameters when they were built (grad buffers, reducer hooks)."""
    types: list[type] = [nn.parallel.DistributedDataParallel]
    try:
        from megatron.core.distributed.data_parallel_base import _BaseDataParallel

        types.append(_BaseDataParallel)
    except ImportError:
        pass
    return tuple(types)


def _is_generic_wrapper(chunk: nn.Module) -> bool:
    """A framework wrapper: its child ``module`` holds every parameter and it holds none of its own.

    A model that merely has a submodule called ``module`` next to other layers is not a wrapper.
    """
    inner = chunk._modules.get("module")
    if inner is None or chunk._parameters:
        return False
    return sum(1 for _ in chunk.parameters()) == sum(1 for _ in inner.parameters())


def unwrap(chunk: Any) -> nn.Module:
    """The bare model inside ``chunk``'s wrappers (the chunk itself when it is not wrapped)."""
    known = _known_wrapper_types()
    while isinstance(chunk, nn.Module):
        inner = getattr(chunk, "module", None)
        if not isinstance(inner, nn.Module) or not (isinstance(chunk, known) or _is_generic_wrapper(chunk)):
            return chunk
        chunk = inner
    raise TypeError(f"a model chunk must be a torch.nn.Module, got {type(chunk).__name__}")


def wrapper_chain(chunk: nn.Module) -> list[nn.Module]:
    """``chunk`` and every wrapper inside it, outermost first, down to (excluding) the bare model."""
    chain = []
    bare = unwrap(chunk)
    while chunk is not bare:
        chain.append(chunk)
        chunk = chunk.module
    return chain
