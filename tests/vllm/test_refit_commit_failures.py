"""A refit's commit that fails part-way for a reason other than a signal is undone (real vLLM, CPU).

The commit copies each NVFP4 layer's new kernel tensors into the served ones, then runs the
KV-cache method's processing. Before, a failure there (a device error in one copy, upstream
processing raising for an attention layer) left the layers before it serving the new weights and
the rest the old. Each test here fails the real copy (or upstream's real processing) of the k-th
layer and checks every parameter and buffer holds the previous refit's bytes at the same address.

The failure is a source tensor whose ``copy_`` raises (``FailingSource``), before or after the
write happens: the real copy of the code under test runs into it, as it would into a CUDA error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_refit_all_or_nothing
import torch
from nvfp4_helpers import assert_same_kernel_state, items, kernel_state
from patchkit.patches.vllm.refit import _impl as _refit_impl
from patchkit.patches.vllm.refit import _writes as _refit_writes
from patchkit.patches.vllm.refit import refit, refit_weights
from test_kv_scale_refit import assert_linear_serves, kv_scales, linear, loaded_model, scales
from test_refit_all_or_nothing import B, assert_serves_as_a_clean_refit

refitted_a = test_refit_all_or_nothing.refitted_a  # the fixture: a dummy-started model serving A


class DeviceLost(RuntimeError):
    """What a CUDA error in a copy looks like to Python."""


class FailingSource(torch.Tensor):
    """A new kernel tensor whose copy into the served tensor fails (after writing, if ``torn``)."""

    torn = False

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") == "copy_" and len(args) > 1 and isinstance(args[1], FailingSource):
            if cls.torn:
                with torch._C.DisableTorchFunctionSubclass():
                    func(args[0], args[1].as_subclass(torch.Tensor), **kwargs)
            raise DeviceLost("CUDA error: an illegal memory access was encountered")
        return super().__torch_function__(func, types, args, kwargs)


@pytest.fixture
def failing_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``arm(layer_index, tensor_index, torn)``: the commit of that layer fails at that tensor's copy."""
    commit = _refit_impl._commit
    calls: list[int] = []

    def arm(layer_index: int, tensor_index: int, torn: bool) -> list[int]:
        def failing(layer: torch.nn.Module, state: Any, fresh: Any, *rest: Any) -> None:
            if len(calls) == layer_index:
                names = [name for name, old in state.kernel.items() if fresh.get(name) is not old]
                name = names[tensor_index]
                for group in (fresh.params, fresh.buffers, fresh.attrs):
                    if name in group:
                        group[name] = group[name].detach().as_subclass(FailingSource)
            calls.append(1)
            commit(layer, state, fresh, *rest)

        monkeypatch.setattr(FailingSource, "torn", torn)
        monkeypatch.setattr(_refit_impl, "_commit", failing)
        return calls

    yield arm
    monkeypatch.undo()


@pytest.mark.parametrize("torn", [False, True], ids=["before-write", "after-write"])
@pytest.mark.parametrize(("layer_index", "tensor_index"), [(0, 0), (1, 0), (1, -1), (2, 0), (2, -1)],
                         ids=["up-first", "down-first", "down-last", "moe-first", "moe-last"])
def test_a_copy_failing_at_the_kth_layer_leaves_every_layer_old(refitted_a: Any, failing_commit: Any,
                                                                layer_index: int, tensor_index: int,
                                                                torn: bool) -> None:
    before = kernel_state(refitted_a)
    calls = failing_commit(layer_index, tensor_index, torn)
    with pytest.raises(DeviceLost):
        refit_weights(refitted_a, items(dict(B)))
    assert len(calls) == layer_index + 1  # the layers before it had been committed
    assert not _refit_writes.installed()
    assert_same_kernel_state(refitted_a, before)


def test_after_a_failed_commit_the_next_refit_serves_exactly_its_weights(refitted_a: Any,
                                                                         failing_commit: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    failing_commit(2, -1, True)
    with pytest.raises(DeviceLost):
        refit_weights(refitted_a, items(dict(B)))
    monkeypatch.undo()
    refit_weights(refitted_a, items(dict(B)))
    assert_serves_as_a_clean_refit(refitted_a, B)
    refit_weights(refitted_a, items(dict(B[::-1])))  # the fixture's own check ends on B


def test_kv_scale_processing_failing_after_the_layers_were_copied_undoes_all(
    nvfp4_refit_patch: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream's processing writes ``_k_scale``/``_v_scale`` in place, then raises: the NVFP4 layer
    committed before it and the scales it wrote both come back."""
    model = loaded_model()
    attn = model.layers[0].self_attn.attn
    before, scales_before = kernel_state(model), scales(model)
    process = attn.quant_method.process_weights_after_loading

    def failing(layer: torch.nn.Module) -> None:
        process(layer)
        raise ValueError("Only support per-tensor scaling factor for fp8 KV cache")

    monkeypatch.setattr(attn.quant_method, "process_weights_after_loading", failing)
    with pytest.raises(ValueError, match="per-tensor"):
        with refit(model):
            model.load_weights(items({**linear(1), **kv_scales(2.0, 4.0)}))
    assert scales(model) == scales_before
    assert_same_kernel_state(model, before)
    assert "k_scale" not in dict(attn.named_parameters())
    monkeypatch.undo()
    with refit(model):
        model.load_weights(items({**linear(1), **kv_scales(2.0, 4.0)}))
    assert scales(model) == (2.0, 4.0, 2.0, 4.0)
    assert_linear_serves(model, linear(1))
