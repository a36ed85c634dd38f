"""``megatron.ddp_buffers_without_cpu_backup`` on a CUDA GPU with the real torch_memory_saver.

Run on a GPU machine with ``-m gpu``; skipped without CUDA or torch_memory_saver. A DDP built with
slime's keywords (distributed optimizer on) trains one step; pausing its tags releases the buffers'
GPU memory, and resuming maps fresh memory without restoring the contents (no CPU backup), while a
region with CPU backup gets its contents back. The saver runs in torch_memory_saver's ``torch`` hook
mode (no ``LD_PRELOAD`` in a test process).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch_memory_saver")

import torch  # noqa: E402
from patchkit.patches.megatron.memory._checks._ddp_buffer_regions import build_ddp, train_step  # noqa: E402

import patchkit  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PATCH = "megatron.ddp_buffers_without_cpu_backup"
HIDDEN = 1024  # 4 Mi float32 parameters: 16 MiB each for the param and the grad buffer
MiB = 1 << 20


def _saver():
    from torch_memory_saver import torch_memory_saver

    pending = vars(torch_memory_saver).get("_impl_ctor_kwargs")
    if pending is not None and "hook_mode" not in pending:
        torch_memory_saver.hook_mode = "torch"  # no LD_PRELOAD here: the in-process allocator hook
    return torch_memory_saver


def _free_bytes() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def test_paused_buffers_release_gpu_memory_and_resume_without_their_contents(megatron_gpu) -> None:
    saver = _saver()
    with patchkit.applied(PATCH):
        ddp = build_ddp(True, hidden=HIDDEN, device="cuda", disable_grad_buffers_cpu_backup=True,
                        disable_param_buffers_cpu_backup=True)
    with saver.region(tag="kept_with_backup", enable_cpu_backup=True):
        kept = torch.full((4 * MiB,), 3.0, device="cuda")  # 16 MiB with CPU backup
    grads = train_step(ddp)
    assert any(grad.abs().sum() > 0 for grad in grads.values())
    grad_data = [buffer.grad_data.clone() for buffer in ddp.buffers]
    param_data = [buffer.param_data.clone() for buffer in ddp.buffers]
    buffer_bytes = sum(buffer.grad_data.nbytes + buffer.param_data.nbytes for buffer in ddp.buffers)
    assert buffer_bytes >= 32 * MiB

    before = _free_bytes()
    saver.pause("grad_buffer")
    saver.pause("param_buffer")
    released = _free_bytes() - before
    saver.pause("kept_with_backup")
    released_all = _free_bytes() - before
    # Write over the memory the pause gave back, so unrestored contents cannot survive by chance.
    scribble = torch.full((buffer_bytes // 4,), 7.0, device="cuda")
    del scribble
    torch.cuda.empty_cache()
    saver.resume("kept_with_backup")
    saver.resume("param_buffer")
    saver.resume("grad_buffer")
    after_resume = _free_bytes()

    assert released >= buffer_bytes, (released, buffer_bytes)
    assert released_all >= buffer_bytes + kept.nbytes, (released_all, buffer_bytes, kept.nbytes)
    assert before - after_resume <= 4 * MiB, (before, after_resume)  # the memory is back in use
    # No CPU backup: the buffers come back as fresh memory, their contents not restored ...
    for saved, buffer in zip(grad_data, ddp.buffers, strict=True):
        assert not torch.equal(buffer.grad_data, saved)
    for saved, buffer in zip(param_data, ddp.buffers, strict=True):
        assert not torch.equal(buffer.param_data, saved)
    # ... while the region with CPU backup gets its contents back.
    assert torch.equal(kept, torch.full_like(kept, 3.0))

    # A trainer reloads its weights (slime from its weights backup, the distributed optimizer from its
    # main params) and zeroes the grad buffer before the next step: the same step gives the same grads.
    for saved, buffer in zip(param_data, ddp.buffers, strict=True):
        buffer.param_data.copy_(saved)
    again = train_step(ddp)
    for name, grad in grads.items():
        torch.testing.assert_close(again[name], grad, rtol=0, atol=0, msg=name)
