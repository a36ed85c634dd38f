"""The refit's write counter and loader wrapper (``_refit_loaders``), on plain tensors.

The counter is a ``TorchFunctionMode`` (cheaper than the ``TorchDispatchMode`` it replaced, see the
module docstring): it must see every in-place write a vLLM loader makes, and nothing else.
"""

from __future__ import annotations

import pytest
import torch
from patchkit.patches.vllm._refit_loaders import WriteCounter, wrap_counting_loader
from patchkit.patches.vllm._refit_state import LoadLog


@pytest.mark.parametrize(("write", "elements"), [
    (lambda t: t.data.copy_(torch.ones(4, 8)), 32),
    (lambda t: t.data.narrow(0, 1, 2).copy_(torch.ones(2, 8)), 16),
    (lambda t: t.data.__setitem__((1, 2), torch.tensor(3.0)), 1),  # t[1, 2] = v
    (lambda t: t.data[3].__setitem__(slice(0, 4), 1.0), 4),  # t[3][:4] = v (fused-MoE scales)
    (lambda t: t.data.fill_(2.0), 32),  # default_weight_loader for scalars
    (lambda t: t.data[0].zero_(), 8),
    (lambda t: torch.add(torch.ones(4, 8), 1, out=t.data), 32),
    (lambda t: (t.data.sum(), t.data.clone(), t.data.narrow(0, 0, 1)), 0),  # reads only
])
def test_counter_counts_in_place_writes_only(write, elements: int) -> None:
    tensor = torch.nn.Parameter(torch.zeros(4, 8), requires_grad=False)
    with WriteCounter() as counter:
        write(tensor)
    assert counter.copied == elements


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
    wrap_counting_loader(param, "w", log, check=lambda target, tensor: checked.append((target, tensor)))
    tensor = torch.ones(8) if loader is not plain_loader else torch.ones(1, 8)
    if call == "positional":
        param.weight_loader(param, tensor)
    elif call == "keyword":
        param.weight_loader(param=param, loaded_weight=tensor)
    else:
        param.weight_loader(param, loaded_weight=tensor)
    assert checked == [(param, tensor)]
    assert log.copied == {"w": 8} and torch.equal(param.data, torch.ones(1, 8))
