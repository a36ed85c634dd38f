"""megatron-core 0.14-0.18: the allocation block shares one buffer for MXFP8 parameters only."""

from __future__ import annotations

from typing import Any

from megatron.core.distributed import param_and_grad_buffer

from . import regions


def shares_one_buffer(buffer: Any) -> bool:
    """Upstream's test for the shared buffer, on the buffer being built: 0.14-0.16 read it from the
    ``params`` argument, 0.17-0.18 from ``self.params``, the same list (``self.params = params``)."""
    return bool(buffer.ddp_config.use_distributed_optimizer) and any(
        param_and_grad_buffer.is_mxfp8tensor(p) for p in buffer.params)


def wrap_allocation_context(original: Any) -> Any:
    """The module's ``nullcontext``, entering the buffers' regions in the allocation block."""
    return regions.wrap_allocation_context(original, shares_one_buffer)
