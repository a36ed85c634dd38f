"""``buffers_without_cpu_backup``: the DDP keywords of ``megatron.ddp_buffers_without_cpu_backup`` for
code that builds the DDP itself (``megatron.training``'s or Megatron-Bridge's ``get_model``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._errors import BufferRegionsUnavailableError
from ._ddp_buffers_without_cpu_backup import regions

PATCH_ID = "megatron.ddp_buffers_without_cpu_backup"


@contextlib.contextmanager
def buffers_without_cpu_backup(grad: bool = True, param: bool = True) -> Iterator[None]:
    """Every megatron-core ``DistributedDataParallel`` built in the block allocates its grad buffer
    (``grad``) in ``torch_memory_saver.region(tag="grad_buffer", enable_cpu_backup=False)`` and, with
    the distributed optimizer, its param buffer (``param``) in ``region(tag="param_buffer", ...)``: as
    if built with ``disable_grad_buffers_cpu_backup=grad, disable_param_buffers_cpu_backup=param``.

    For a trainer whose DDPs are built by someone else's code::

        with memory.buffers_without_cpu_backup(grad=args.disable_grad_buffers_cpu_backup,
                                               param=args.disable_param_buffers_cpu_backup):
            model = get_model(model_provider, ModelType.encoder_or_decoder)

    Raises :class:`BufferRegionsUnavailableError` if the patch is not installed (the buffers would
    keep their backup), ``TorchMemorySaverMissingError`` if torch_memory_saver does not import, and a
    DDP built in the block with ``nccl_ub`` raises ``BufferRegionError``.
    """
    import patchkit

    problem = patchkit.why_not_installed(PATCH_ID)
    if problem is not None and (grad or param):
        raise BufferRegionsUnavailableError(
            f"{problem}: DDP buffers built in this block would keep their CPU backup; call "
            f"patchkit.apply_all() (or apply {PATCH_ID!r}) before building the model, or see `patchkit list` "
            "for the supported megatron-core versions")
    with regions.requested(grad, param):
        yield
