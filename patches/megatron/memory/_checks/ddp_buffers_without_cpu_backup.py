"""Self-check of ``megatron.ddp_buffers_without_cpu_backup``: upstream's DDP, built with slime's
keywords, allocates its param and grad buffers in their regions without CPU backup, and trains as before.
"""

from __future__ import annotations

from typing import Any

import torch

from patchkit.selfcheck import CheckContext, expect

from ..._checks._harness import first_line


def check_ddp_buffers_without_cpu_backup(context: CheckContext) -> None:
    """A tiny DDP with the distributed optimizer, built with ``disable_grad_buffers_cpu_backup=True,
    disable_param_buffers_cpu_backup=True`` on the CPU under a recording torch_memory_saver: every
    buffer's ``param_data`` was allocated in ``region("param_buffer", enable_cpu_backup=False)`` alone,
    its ``grad_data`` in ``region("grad_buffer", enable_cpu_backup=False)`` alone, and one step's
    gradients equal those of the same DDP built without the keywords."""
    from ._ddp_buffer_regions import build_ddp, cpu_ddp_world, recording_saver, train_step

    with cpu_ddp_world(), recording_saver() as saver:
        try:
            ddp = build_ddp(True, disable_grad_buffers_cpu_backup=True, disable_param_buffers_cpu_backup=True)
        except TypeError as exc:
            expect(False, "DistributedDataParallel takes disable_grad_buffers_cpu_backup and "
                   "disable_param_buffers_cpu_backup", "a DDP", first_line(exc))
            return
        placed: list[Any] = [(saver.regions_of(buffer.param_data), saver.regions_of(buffer.grad_data))
                             for buffer in ddp.buffers]
        expect(bool(placed) and all(where == ([("param_buffer", False)], [("grad_buffer", False)])
                                    for where in placed),
               "each DDP buffer's param_data / grad_data allocated in its region without CPU backup",
               "([('param_buffer', False)], [('grad_buffer', False)]) per buffer", placed)
        grads = train_step(ddp)
        reference = train_step(build_ddp(True))
    for name, grad in reference.items():
        expect(torch.equal(grads[name], grad), f"{name}'s main_grad after one step as without the keywords",
               grad.tolist(), grads[name].tolist())
