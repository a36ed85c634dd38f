"""megatron-core 0.19: the allocation block shares one buffer for MXFP8 and grouped MXFP8 parameters."""

from __future__ import annotations

from typing import Any

from megatron.core.distributed import param_and_grad_buffer

from . import regions


def shares_one_buffer(buffer: Any) -> bool:
    """Upstream's test for the shared buffer, on the buffer being built (``self.params``)."""
    return bool(buffer.ddp_config.use_distributed_optimizer) and any(
        param_and_grad_buffer.is_mxfp8tensor(p) or param_and_grad_buffer.is_grouped_mxfp8tensor(p)
        for p in buffer.params)


def wrap_allocation_context(original: Any) -> Any:
    """The module's ``nullcontext``, entering the buffers' regions in the allocation block."""
    return regions.wrap_allocation_context(original, shares_one_buffer)
