"""A tiny megatron-core DDP built on the CPU under a recording torch_memory_saver, for the
``megatron.ddp_buffers_without_cpu_backup`` self-check and its tests.

torch_memory_saver's regions need CUDA (its allocator hooks the CUDA driver), so on the CPU
:class:`RecordingSaver` stands in for it at its API boundary, ``torch_memory_saver.region(tag=...,
enable_cpu_backup=...)``: it records each region entered and the storages allocated inside it, and
allocates nothing itself. :func:`recording_saver` puts it in place of the process's singleton for the
block (where torch_memory_saver is not installed, in a stand-in module of that name, removed after).
The model, ``DistributedDataParallel``, its buffers, bucketing and grad sync are upstream's, on a gloo
group of one rank with ``torch.cuda.current_device()`` answering ``"cpu"`` (the CPU harness).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

HIDDEN = 8


@dataclasses.dataclass
class Region:
    """One ``region()`` entered: its arguments and the storages (data pointers) allocated inside."""

    tag: str
    enable_cpu_backup: bool
    storages: set[int] = dataclasses.field(default_factory=set)


class _StorageRecorder(TorchDispatchMode):
    def __init__(self, region: Region) -> None:
        super().__init__()
        self._region = region

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self._region.storages.add(tensor.untyped_storage().data_ptr())
        return out


class RecordingSaver:
    """Stands in for ``torch_memory_saver.torch_memory_saver`` on a CPU: ``region`` records, nothing more."""

    def __init__(self) -> None:
        self.regions: list[Region] = []

    @contextlib.contextmanager
    def region(self, tag: str = "default", enable_cpu_backup: bool = False, **kwargs: Any) -> Iterator[None]:
        region = Region(tag, enable_cpu_backup)
        self.regions.append(region)
        with _StorageRecorder(region):
            yield

    def regions_of(self, tensor: torch.Tensor) -> list[tuple[str, bool]]:
        """(tag, enable_cpu_backup) of every region ``tensor``'s storage was allocated in."""
        pointer = tensor.untyped_storage().data_ptr()
        return [(region.tag, region.enable_cpu_backup) for region in self.regions if pointer in region.storages]


@contextlib.contextmanager
def recording_saver() -> Iterator[RecordingSaver]:
    """A :class:`RecordingSaver` as the process's ``torch_memory_saver.torch_memory_saver`` for the block."""
    try:
        import torch_memory_saver as package
    except ImportError:
        package = None
    saver = RecordingSaver()
    if package is None:
        stand_in = types.ModuleType("torch_memory_saver")
        stand_in.torch_memory_saver = saver  # type: ignore[attr-defined]
        sys.modules["torch_memory_saver"] = stand_in
        try:
            yield saver
        finally:
            sys.modules.pop("torch_memory_saver", None)
        return
    singleton = package.torch_memory_saver
    package.torch_memory_saver = saver
    try:
        yield saver
    finally:
        package.torch_memory_saver = singleton


class TinyModel(torch.nn.Module):
    """Two linear layers: parameters of two shapes, one bucket."""

    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.hidden = hidden
        self.first = torch.nn.Linear(hidden, 2 * hidden)
        self.second = torch.nn.Linear(2 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


def build_ddp(distributed_optimizer: bool, hidden: int = HIDDEN, device: str = "cpu", **keywords: Any) -> Any:
    """Upstream's ``DistributedDataParallel`` over a seeded float32 :class:`TinyModel` on ``device``,
    built with ``keywords``; call with Megatron's parallel state up (on the CPU: in :func:`cpu_ddp_world`)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    torch.manual_seed(0)
    config = TransformerConfig(num_layers=1, hidden_size=HIDDEN, num_attention_heads=1)
    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer)
    return DistributedDataParallel(config, ddp_config, TinyModel(hidden).to(device), **keywords)


def train_step(ddp: Any) -> dict[str, torch.Tensor]:
    """One forward and backward of a fixed batch and the grad sync: every parameter's ``main_grad``."""
    ddp.zero_grad_buffer()
    first = next(ddp.module.parameters())
    batch = torch.randn(4, ddp.module.hidden, generator=torch.Generator().manual_seed(1)).to(first.device)
    ddp(batch).square().sum().backward()
    ddp.finish_grad_sync()
    return {name: param.main_grad.clone() for name, param in ddp.module.named_parameters()}


@contextlib.contextmanager
def cpu_ddp_world() -> Iterator[None]:
    """The CPU harness and Megatron's parallel state on a gloo group of one, for the block."""
    from ..._checks._cpu_stand_in import cpu_megatron, destroy_parallel_state, initialize_parallel_state

    with cpu_megatron():
        initialize_parallel_state()
        try:
            yield
        finally:
            destroy_parallel_state()
