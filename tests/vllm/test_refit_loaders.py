"""The refit's write counter (``refit._writes``) and loader wrapper (``refit._loaders``), on plain tensors.

The counter wraps ``torch.Tensor``'s in-place writes while a refit holds it (cheaper than the
function and dispatch modes it replaced, see ``refit._writes``): it must see every in-place write a
vLLM loader makes, once, in its own thread only, and leave ``torch.Tensor`` as it was.
"""

from __future__ import annotations

import threading

import pytest
import torch
from patchkit.patches.vllm.refit import _writes as _refit_writes
from patchkit.patches.vllm.refit._loaders import counting_loader, get_loader, set_loader
from patchkit.patches.vllm.refit._state import LoadLog
from patchkit.patches.vllm.refit._writes import WriteCounter


@pytest.mark.parametrize(("write", "elements"), [
    (lambda t: t.data.copy_(torch.ones(4, 8)), 32),
    (lambda t: t.data.narrow(0, 1, 2).copy_(torch.ones(2, 8)), 16),
    (lambda t: t.data.__setitem__((1, 2), torch.tensor(3.0)), 1),  # t[1, 2] = v
    (lambda t: t.data[3].__setitem__(slice(0, 4), 1.0), 4),  # t[3][:4] = v (fused-MoE scales)
    (lambda t: t.data.fill_(2.0), 32),  # default_weight_loader for scalars
    (lambda t: t.data[0].zero_(), 8),
    # Not counted (no vLLM loader writes this way): a refit through it fails "not loaded in full".
    (lambda t: torch.add(torch.ones(4, 8), 1, out=t.data), 0),
    (lambda t: (t.data.sum(), t.data.clone(), t.data.narrow(0, 0, 1)), 0),  # reads only
])
def test_counter_counts_in_place_writes_only(write, elements: int) -> None:
    tensor = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)
    with WriteCounter() as counter:
        write(tensor)
    assert counter.copied == elements
    assert not _refit_writes.installed()


class TorchFunctionParameter(torch.nn.Parameter):
    """Like vLLM's ``BasevLLMParameter``: a subclass whose ``__torch_function__`` calls ``func`` again."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize(("write", "elements"), [
    (lambda p: p.copy_(torch.ones(4, 8)), 32),
    (lambda p: p.__setitem__(1, 2.0), 8),
    (lambda p: p.fill_(1.0), 32),
])
def test_a_write_through_a_torch_function_subclass_counts_once(write, elements: int) -> None:
    # torch hands the subclass's __torch_function__ the torch.Tensor attribute, i.e. the counting
    # wrapper itself: without the guard each write counted twice, and a half-loaded parameter passed.
    param = TorchFunctionParameter(torch.zeros(4, 8), requires_grad=False)
    with torch.no_grad(), WriteCounter() as counter:
        write(param)
    assert counter.copied == elements


def test_counters_nest_and_count_their_own_writes() -> None:
    tensor = torch.zeros(4, 8)
    with WriteCounter() as outer:
        tensor.copy_(torch.ones(4, 8))
        with WriteCounter() as inner:
            tensor[0].fill_(2.0)
        tensor[1].zero_()
    assert (outer.copied, inner.copied) == (40, 8)


def test_writes_of_other_threads_are_not_counted() -> None:
    """Between loader calls the exporter (or any thread) writes tensors too; only the loader's count."""
    tensor = torch.zeros(1000)
    started, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        started.wait()
        for _ in range(100):
            tensor.copy_(torch.ones(1000))
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with WriteCounter() as counter:
        started.set()
        done.wait(timeout=30)
        torch.zeros(3).fill_(1.0)
    worker.join()
    assert counter.copied == 3


def test_holds_install_once_and_the_last_release_restores_torch_tensor() -> None:
    before = {name: getattr(torch.Tensor, name) for name in ("copy_", "fill_", "zero_", "__setitem__")}
    first, second = _refit_writes.hold(), _refit_writes.hold()
    assert _refit_writes.installed()
    first.release()
    first.release()  # idempotent: one hold, one release
    assert _refit_writes.installed()
    second.release()
    assert not _refit_writes.installed()
    assert {name: getattr(torch.Tensor, name) for name in before} == before
    assert not any(name in vars(torch.Tensor) for name in before)


def test_a_write_that_raises_still_leaves_the_thread_counting() -> None:
    with WriteCounter() as counter:
        with pytest.raises(RuntimeError):
            torch.zeros(4).copy_(torch.ones(5))
        torch.zeros(4).copy_(torch.ones(4))
    assert counter.copied == 4


class Layer:
    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: int = 0) -> None:
        param.data[shard_id].copy_(loaded_weight)


def plain_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    param.data.copy_(loaded_weight)


@pytest.mark.parametrize("call", ["positional", "keyword", "mixed"])
@pytest.mark.parametrize("loader", [Layer().weight_loader, plain_loader], ids=["bound-method", "function"])
def test_wrapped_loader_finds_destination_and_tensor_however_called(call: str, loader) -> None:
    param = torch.nn.Parameter(torch.zeros(1, 8), requires_grad=False)
    param.weight_loader = loader
    log, checked = LoadLog(), []
    set_loader(param, counting_loader(get_loader(param), "w", lambda: log, param.numel(),
                                      check=lambda target, tensor: checked.append((target, tensor))))
    tensor = torch.ones(8) if loader is not plain_loader else torch.ones(1, 8)
    if call == "positional":
        param.weight_loader(param, tensor)
    elif call == "keyword":
        param.weight_loader(param=param, loaded_weight=tensor)
    else:
        param.weight_loader(param, loaded_weight=tensor)
    assert checked == [(param, tensor)]
    assert log.copied == {"w": 8} and torch.equal(param.data, torch.ones(1, 8))
