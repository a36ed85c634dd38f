"""Memory management around megatron-core with torch_memory_saver: the patches and one helper.

The declared patches: ``megatron.tms_hook_mode`` (megatron's import keeps the process's hook mode)
and ``megatron.ddp_buffers_without_cpu_backup`` (DDP's buffers in regions without CPU backup, asked
for with ``DistributedDataParallel(..., disable_grad_buffers_cpu_backup=True,
disable_param_buffers_cpu_backup=True)``). For DDPs built by ``get_model``::

    from patchkit.patches.megatron import memory

    with memory.buffers_without_cpu_backup(grad=True, param=True):
        model = get_model(model_provider, ModelType.encoder_or_decoder)

The public names are imported from their private modules on first use (PEP 562), so importing this
package, as the catalogue does for its declarations, imports neither torch nor megatron.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ... import _exports
from .._errors import (
    BufferAllocationMismatchError,
    BufferRegionError,
    BufferRegionsUnavailableError,
    TorchMemorySaverMissingError,
)

if TYPE_CHECKING:
    from ._api import buffers_without_cpu_backup

#: Imported on first use; the errors above are bound now, so a caller catches them without megatron.
_EXPORTS = {"buffers_without_cpu_backup": "._api"}
__all__ = [
    "BufferAllocationMismatchError",
    "BufferRegionError",
    "BufferRegionsUnavailableError",
    "TorchMemorySaverMissingError",
    "buffers_without_cpu_backup",
]
__getattr__, __dir__ = _exports.lazy_exports(__name__, _EXPORTS)
