"""DDP's grad and param buffers allocated in torch_memory_saver regions without CPU backup.

Upstream ``_ParamAndGradBuffer.__init__`` allocates its flat buffers in one block::

    if self.nccl_ub:
        ...
        mem_alloc_context = functools.partial(nccl_allocator.nccl_mem, pool, ...)
    else:
        # If nccl_ub is False, mem_alloc_context is nullcontext.
        mem_alloc_context = nullcontext

    with mem_alloc_context():
        if self.ddp_config.use_distributed_optimizer and any(is_mxfp8tensor(p) ...):
            self.shared_buffer = torch.zeros(self.numel, dtype=self.grad_dtype, ...)
            ...
        else:
            if self.ddp_config.use_distributed_optimizer:
                self.param_data = torch.zeros(...)
            self.grad_data = torch.zeros(...)

``mem_alloc_context`` is upstream's own allocation hook (NCCL user buffers use it), so this patch
hooks the same place: the module's ``nullcontext``, called there with no argument, becomes
:class:`BufferRegions` while a buffer that asked for regions is being built. It enters
``torch_memory_saver.region(tag=..., enable_cpu_backup=False)`` around each ``torch.zeros`` of the
block, with slime's tags: ``param_buffer`` for ``param_data`` (distributed optimizer only: without it
the parameters are the module's own and stay where they are), ``grad_buffer`` for ``grad_data``, and
for the MXFP8 shared buffer the param region when params are asked for, else the grad region.
Everything else of ``__init__`` (layout, bucketing, views of ``param.data`` and ``param.main_grad``)
is upstream's code unchanged.

The request comes from ``DistributedDataParallel(..., disable_grad_buffers_cpu_backup=True,
disable_param_buffers_cpu_backup=True)`` (slime's keywords) or from :func:`requested` around any code
that builds the DDP (``megatron.training.get_model``, Megatron-Bridge's ``get_model``), and lasts for
that construction only (a context variable: other threads and later DDPs are untouched).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..._errors import BufferAllocationMismatchError, BufferRegionError, TorchMemorySaverMissingError

logger = logging.getLogger(__name__)

#: slime's region tags: ``torch_memory_saver.pause(tag)`` / ``resume(tag)`` address the buffers by them.
GRAD_TAG = "grad_buffer"
PARAM_TAG = "param_buffer"

GRAD_KEYWORD = "disable_grad_buffers_cpu_backup"
PARAM_KEYWORD = "disable_param_buffers_cpu_backup"


@dataclasses.dataclass(frozen=True)
class Request:
    """Which of a DDP's buffers go into regions without CPU backup, and the saver that owns them."""

    grad: bool
    param: bool
    saver: Any

    def __bool__(self) -> bool:
        return self.grad or self.param


#: The request in force while a DDP is built (set by the keywords or :func:`requested`).
_REQUEST: contextvars.ContextVar[Request | None] = contextvars.ContextVar("ddp_buffer_regions", default=None)
#: The ``_ParamAndGradBuffer`` whose allocation block is next, with the request it serves.
_BUILDING: contextvars.ContextVar[tuple[Any, Request] | None] = contextvars.ContextVar(
    "ddp_buffer_building", default=None)


def memory_saver(keyword: str) -> Any:
    """The process's ``torch_memory_saver`` singleton, looked up now (so the saver a process set up,
    or a test's recording one, is the one used); a typed error naming ``keyword`` if it does not import."""
    try:
        import torch_memory_saver
    except ImportError as exc:
        raise TorchMemorySaverMissingError(
            f"{keyword}=True allocates DDP buffers in torch_memory_saver regions, but torch_memory_saver "
            f"does not import ({exc}); install torch-memory-saver or leave {keyword} False") from exc
    return torch_memory_saver.torch_memory_saver


def make_request(grad: bool, param: bool) -> Request | None:
    """The request for these switches combined with one already in force (a DDP built inside
    :func:`requested` may add its own keywords, never drop the block's); None if nothing is asked."""
    outer = _REQUEST.get()
    grad, param = grad or bool(outer and outer.grad), param or bool(outer and outer.param)
    if not (grad or param):
        return None
    if outer is not None:
        return Request(grad=grad, param=param, saver=outer.saver)
    return Request(grad=grad, param=param, saver=memory_saver(GRAD_KEYWORD if grad else PARAM_KEYWORD))


@contextlib.contextmanager
def requested(grad: bool, param: bool) -> Iterator[None]:
    """Every megatron-core DDP built in the block allocates its grad (``grad``) and, with the
    distributed optimizer, param (``param``) buffers in regions without CPU backup."""
    request = make_request(grad, param)
    token = _REQUEST.set(request)
    try:
        yield
    finally:
        _REQUEST.reset(token)


def _refuse_nccl_ub(ddp_config: Any, request: Request) -> None:
    # NCCL user buffers come from NCCL's memory pool (upstream's mem_alloc_context): a region cannot
    # hold them, and slime refuses the combination too.
    if getattr(ddp_config, "nccl_ub", False):
        keywords = [name for name, on in ((GRAD_KEYWORD, request.grad), (PARAM_KEYWORD, request.param)) if on]
        raise BufferRegionError(
            f"{' and '.join(keywords)}=True is not supported with DistributedDataParallelConfig(nccl_ub=True): "
            "NCCL user buffers are allocated from NCCL's memory pool, which torch_memory_saver cannot "
            "pause; turn nccl_ub off or leave the buffers' CPU backup on")


def wrap_ddp_init(original: Callable[..., None]) -> Callable[..., None]:
    """``DistributedDataParallel.__init__`` taking slime's two keywords (both False: upstream's call)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, disable_grad_buffers_cpu_backup: bool = False,
                 disable_param_buffers_cpu_backup: bool = False, **kwargs: Any) -> None:
        request = make_request(disable_grad_buffers_cpu_backup, disable_param_buffers_cpu_backup)
        if request is None:
            return original(self, *args, **kwargs)
        ddp_config = signature.bind_partial(self, *args, **kwargs).arguments.get("ddp_config")
        _refuse_nccl_ub(ddp_config, request)
        token = _REQUEST.set(request)
        try:
            return original(self, *args, **kwargs)
        finally:
            _REQUEST.reset(token)

    # Callers that pass only the keywords a signature names (config-to-kwargs helpers) see both.
    keywords = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=False, annotation=bool)
                for name in (GRAD_KEYWORD, PARAM_KEYWORD)]
    __init__.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), *keywords])
    return __init__


def wrap_buffer_init(original: Callable[..., None]) -> Callable[..., None]:
    """``_ParamAndGradBuffer.__init__`` that marks itself as the buffer whose allocation block is next
    while a request is in force (unchanged otherwise)."""

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        request = _REQUEST.get()
        if not request:
            return original(self, *args, **kwargs)
        token = _BUILDING.set((self, request))
        try:
            return original(self, *args, **kwargs)
        finally:
            _BUILDING.reset(token)

    return __init__


def region_tags(buffer: Any, request: Request, shares_one_buffer: bool) -> list[str | None]:
    """The region of each ``torch.zeros`` of upstream's allocation block, in its order (None: no region)."""
    param = request.param and bool(buffer.ddp_config.use_distributed_optimizer)
    if shares_one_buffer:  # one buffer serves param all-gather and grad reduce-scatter
        return [PARAM_TAG if param else (GRAD_TAG if request.grad else None)]
    grad_data = GRAD_TAG if request.grad else None
    if buffer.ddp_config.use_distributed_optimizer:
        return [PARAM_TAG if param else None, grad_data]
    return [grad_data]


class BufferRegions(TorchFunctionMode):
    """Upstream's allocation block with each ``torch.zeros`` in its region of :func:`region_tags`.

    A ``TorchFunctionMode`` sees the block's calls without changing them: the buffers are allocated
    by upstream's own ``torch.zeros`` calls, with upstream's sizes and dtypes, only inside a region.
    """

    def __init__(self, saver: Any, tags: list[str | None]) -> None:
        super().__init__()
        self._saver = saver
        self._tags = list(tags)
        self._planned = len(tags)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not torch.zeros:
            return func(*args, **kwargs)
        if not self._tags:
            raise BufferAllocationMismatchError(
                f"_ParamAndGradBuffer allocated more than the {self._planned} buffer(s) this release's "
                "allocation block makes; no region was chosen for the extra one")
        tag = self._tags.pop(0)
        if tag is None:
            return func(*args, **kwargs)
        logger.debug("patchkit: DDP buffer of %s elements in torch_memory_saver region %r without CPU backup",
                     args[0] if args else "?", tag)
        with self._saver.region(tag=tag, enable_cpu_backup=False):
            return func(*args, **kwargs)

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> Any:
        result = super().__exit__(exc_type, exc, traceback)
        if exc_type is None and self._tags:
            raise BufferAllocationMismatchError(
                f"_ParamAndGradBuffer allocated {self._planned - len(self._tags)} of the {self._planned} "
                "buffer(s) this release's allocation block makes")
        return result


def wrap_allocation_context(original: Any, shares_one_buffer: Callable[[Any], bool]) -> Callable[..., Any]:
    """The module's ``nullcontext``: :class:`BufferRegions` where upstream's allocation block calls it
    (no argument, a buffer being built with a request), ``nullcontext`` everywhere else."""

    @functools.wraps(original, updated=())
    def nullcontext(*args: Any, **kwargs: Any) -> Any:
        building = _BUILDING.get()
        if building is None or args or kwargs:
            return original(*args, **kwargs)
        buffer, request = building
        _BUILDING.set(None)  # the block runs once per buffer: later calls are upstream's nullcontext
        return BufferRegions(request.saver, region_tags(buffer, request, shares_one_buffer(buffer)))

    return nullcontext
