"""DDP's grad and param buffers in torch_memory_saver regions without CPU backup (megatron-core 0.14-0.19).

Declaration module. ``DistributedDataParallel(..., disable_grad_buffers_cpu_backup=True,
disable_param_buffers_cpu_backup=True)`` (slime's keywords, default False) allocates each
``_ParamAndGradBuffer``'s ``grad_data`` in ``torch_memory_saver.region(tag="grad_buffer",
enable_cpu_backup=False)`` and, with the distributed optimizer, its ``param_data`` in
``region(tag="param_buffer", enable_cpu_backup=False)``; the MXFP8 shared buffer goes to the param
region when params are asked for, else to the grad region. ``memory.buffers_without_cpu_backup()``
asks the same for every DDP built in a block (``get_model``). The hook is upstream's allocation
context (``mem_alloc_context``, the module's ``nullcontext`` outside NCCL user buffers), so the rest
of ``__init__`` is upstream's.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import MEGATRON_CORE

_DDP = "megatron.core.distributed.distributed_data_parallel"
_BUFFER = "megatron.core.distributed.param_and_grad_buffer"
_INSTALLS_SHARED = (
    Wrap(f"{_DDP}:DistributedDataParallel.__init__", "._ddp_buffers_without_cpu_backup.regions:wrap_ddp_init"),
    Wrap(f"{_BUFFER}:_ParamAndGradBuffer.__init__", "._ddp_buffers_without_cpu_backup.regions:wrap_buffer_init"),
)

PATCHES = (
    Patch(
        id="megatron.ddp_buffers_without_cpu_backup",
        self_check="._checks.ddp_buffers_without_cpu_backup:check_ddp_buffers_without_cpu_backup",
        summary=(
            "DistributedDataParallel(disable_grad_buffers_cpu_backup=True, "
            "disable_param_buffers_cpu_backup=True) allocates the grad buffer, and with the distributed "
            "optimizer the param buffer, in torch_memory_saver regions without CPU backup "
            "(tags 'grad_buffer', 'param_buffer')."
        ),
        why=(
            "A colocated trainer pauses its GPU memory while the rollout engine runs. The grad buffer "
            "is zeroed before every step and the param buffer is reloaded from the optimizer's main "
            "params (distributed optimizer), so copying them to host on pause and back on resume is "
            "wasted time and pinned host memory. slime patches both keywords into megatron's DDP."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/"
            "megatron/core/distributed/param_and_grad_buffer.py"
        ),
        removal="Remove once megatron-core's DDP can allocate its buffers in a caller-given context.",
        opt_in=False,
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="mxfp8-shared-buffer",
                requires={"megatron-core": ">=0.14,<0.19"},
                installs=(*_INSTALLS_SHARED, Wrap(f"{_BUFFER}:nullcontext",
                                                  "._ddp_buffers_without_cpu_backup.v014:wrap_allocation_context")),
            ),
            Variant(
                label="grouped-mxfp8-shared-buffer",
                requires={"megatron-core": ">=0.19,<0.20"},
                installs=(*_INSTALLS_SHARED, Wrap(f"{_BUFFER}:nullcontext",
                                                  "._ddp_buffers_without_cpu_backup.v019:wrap_allocation_context")),
            ),
        ),
    ),
)
