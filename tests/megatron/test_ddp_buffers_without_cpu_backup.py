"""``megatron.ddp_buffers_without_cpu_backup``: upstream's DistributedDataParallel on a one-rank gloo group
(CPU tensors), built with slime's keywords, allocates its buffers in torch_memory_saver regions without
CPU backup.

torch_memory_saver's regions need CUDA, so the tests put ``RecordingSaver`` (``_checks/_ddp_buffer_regions``)
in place of its singleton (or of the module, where it is not installed): it records each region entered
and the storages allocated inside it, which shows which buffer went into which region. Pausing and
resuming real regions is ``test_ddp_buffers_without_cpu_backup_gpu.py``.
"""

from __future__ import annotations

import sys

import pytest
import torch
from patchkit.patches.megatron import memory
from patchkit.patches.megatron.memory._checks import ddp_buffers_without_cpu_backup as check
from patchkit.patches.megatron.memory._checks._ddp_buffer_regions import (
    build_ddp,
    cpu_ddp_world,
    recording_saver,
    train_step,
)

import patchkit
from patchkit.selfcheck import CheckContext, SelfCheckFailed, upstream_behaviour

PATCH = "megatron.ddp_buffers_without_cpu_backup"
GRAD = [("grad_buffer", False)]
PARAM = [("param_buffer", False)]


@pytest.fixture
def patched() -> object:
    with patchkit.applied(PATCH) as statuses:
        assert [status.state.value for status in statuses] == ["applied"]
        yield statuses


@pytest.fixture
def world() -> object:
    with cpu_ddp_world(), recording_saver() as saver:
        yield saver


def _placement(ddp: object) -> list[tuple[list, list]]:
    """Per buffer: the regions its param_data (None without the distributed optimizer) and grad_data
    were allocated in."""
    saver = sys.modules["torch_memory_saver"].torch_memory_saver
    return [(None if buffer.param_data is None else saver.regions_of(buffer.param_data),
             saver.regions_of(buffer.grad_data)) for buffer in ddp.buffers]


@pytest.mark.parametrize(("grad", "param", "expected"), [
    (True, True, (PARAM, GRAD)),
    (True, False, ([], GRAD)),
    (False, True, (PARAM, [])),
])
def test_with_the_distributed_optimizer_each_buffer_goes_to_the_region_asked_for(
        patched, world, grad, param, expected) -> None:
    ddp = build_ddp(True, disable_grad_buffers_cpu_backup=grad, disable_param_buffers_cpu_backup=param)
    placement = _placement(ddp)
    assert placement and all(where == expected for where in placement), placement
    assert all(not region.enable_cpu_backup for region in world.regions)


def test_without_the_distributed_optimizer_only_the_grad_buffer_is_in_a_region(patched, world) -> None:
    # slime: the param switch only applies with the distributed optimizer (no param buffer without it).
    ddp = build_ddp(False, disable_grad_buffers_cpu_backup=True, disable_param_buffers_cpu_backup=True)
    placement = _placement(ddp)
    assert placement and all(where == (None, GRAD) for where in placement), placement
    assert [region.tag for region in world.regions] == ["grad_buffer"] * len(ddp.buffers)


@pytest.mark.parametrize(("grad", "param", "expected"), [
    (True, True, PARAM),
    (True, False, GRAD),
    (False, True, PARAM),
])
def test_the_mxfp8_shared_buffer_goes_to_the_param_region_if_asked_else_the_grad_region(
        patched, world, monkeypatch, grad, param, expected) -> None:
    # MXFP8 parameters need TransformerEngine: upstream's type test answers yes for every parameter,
    # so upstream's own allocation block takes its shared-buffer branch (param all-gather and grad
    # reduce-scatter in one buffer).
    from megatron.core.distributed import param_and_grad_buffer

    monkeypatch.setattr(param_and_grad_buffer, "is_mxfp8tensor", lambda tensor: isinstance(tensor, torch.nn.Parameter))
    ddp = build_ddp(True, disable_grad_buffers_cpu_backup=grad, disable_param_buffers_cpu_backup=param)
    for buffer in ddp.buffers:
        assert buffer.grad_data is buffer.shared_buffer
        assert world.regions_of(buffer.shared_buffer) == expected
    assert len(world.regions) == len(ddp.buffers)


def test_default_keywords_enter_no_region(patched, world) -> None:
    build_ddp(True)
    build_ddp(True, disable_grad_buffers_cpu_backup=False, disable_param_buffers_cpu_backup=False)
    assert world.regions == []


@pytest.mark.parametrize("distributed_optimizer", [True, False])
def test_gradients_and_parameters_are_those_without_the_keywords(patched, world, distributed_optimizer) -> None:
    ddp = build_ddp(distributed_optimizer, disable_grad_buffers_cpu_backup=True,
                    disable_param_buffers_cpu_backup=True)
    reference = build_ddp(distributed_optimizer)
    grads, expected = train_step(ddp), train_step(reference)
    assert world.regions, "the keywords entered no region"
    assert grads.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], rtol=0, atol=0, msg=name)
    for (name, param), (_, reference_param) in zip(ddp.module.named_parameters(),
                                                   reference.module.named_parameters(), strict=True):
        torch.testing.assert_close(param, reference_param, rtol=0, atol=0, msg=name)
    # The grad buffer is the gradients' storage, as upstream maps it.
    for buffer in ddp.buffers:
        assert any(param.main_grad.untyped_storage().data_ptr() == buffer.grad_data.untyped_storage().data_ptr()
                   for param in buffer.params)


def test_the_signature_names_both_keywords(patched) -> None:
    import inspect

    from megatron.core.distributed import DistributedDataParallel

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    for name in ("disable_grad_buffers_cpu_backup", "disable_param_buffers_cpu_backup"):
        assert parameters[name].default is False
    assert "ddp_config" in parameters


def test_without_the_patch_the_keywords_are_refused(world) -> None:
    with pytest.raises(TypeError, match="disable_grad_buffers_cpu_backup"):
        build_ddp(True, disable_grad_buffers_cpu_backup=True, disable_param_buffers_cpu_backup=True)


def test_nccl_ub_is_refused_with_a_typed_error(patched, world) -> None:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=True)
    ddp_config.nccl_ub = True  # set after construction: the check refuses before NCCL is touched
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
    with pytest.raises(memory.BufferRegionError, match="nccl_ub"):
        DistributedDataParallel(config, ddp_config, torch.nn.Linear(8, 8), disable_grad_buffers_cpu_backup=True)
    assert world.regions == []


def test_missing_torch_memory_saver_is_a_typed_error(patched, world, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_memory_saver", None)  # import now raises ImportError
    with pytest.raises(memory.TorchMemorySaverMissingError, match="disable_param_buffers_cpu_backup"):
        build_ddp(True, disable_param_buffers_cpu_backup=True)
    assert issubclass(memory.TorchMemorySaverMissingError, ImportError)


def test_the_block_asks_for_regions_for_every_ddp_built_inside_it(patched, world) -> None:
    # What a framework whose DDPs are built by megatron.training's get_model writes around the call.
    with memory.buffers_without_cpu_backup(grad=True, param=True):
        inside = [build_ddp(True), build_ddp(True)]
    after = build_ddp(True)
    for ddp in inside:
        assert all(where == (PARAM, GRAD) for where in _placement(ddp))
    assert _placement(after) == [([], [])] * len(after.buffers)


def test_a_ddp_in_the_block_may_add_the_other_buffer(patched, world) -> None:
    with memory.buffers_without_cpu_backup(grad=True, param=False):
        ddp = build_ddp(True, disable_param_buffers_cpu_backup=True)
    assert all(where == (PARAM, GRAD) for where in _placement(ddp))


def test_the_block_refuses_when_the_patch_is_not_installed(world) -> None:
    with pytest.raises(memory.BufferRegionsUnavailableError, match=PATCH):
        with memory.buffers_without_cpu_backup():
            pass


def test_the_self_check_passes_with_the_patch(patched) -> None:
    check.check_ddp_buffers_without_cpu_backup(CheckContext(PATCH))


@pytest.mark.breaks("megatron.ddp_buffers_without_cpu_backup")
def test_the_self_check_fails_on_upstreams_ddp(patched) -> None:
    with upstream_behaviour(PATCH), pytest.raises(SelfCheckFailed, match="disable_grad_buffers_cpu_backup"):
        check.check_ddp_buffers_without_cpu_backup(CheckContext(PATCH))
