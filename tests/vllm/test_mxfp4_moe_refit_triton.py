"""MXFP4 fused-MoE layers on vLLM's TRITON backend (what vLLM picks for gpt-oss on Hopper) refitted through
patchkit, on real vLLM.

The layer is vLLM's, with ``GptOssMxfp4Config`` (gpt-oss's SwiGLU-OAI experts: vLLM's Triton MXFP4
kernel takes no other activation, so a canonical ``Mxfp4Config`` layer of SiLU experts never runs it);
the backend is chosen by vLLM's own selection and processed by vLLM's own ``_swizzle_mxfp4`` into
triton_kernels' Hopper layouts (on CPU: ``mxfp4_triton_harness``, read it for the two answers it stands
in for). The proof for every case is vLLM's own first load of the same checkpoint into a fresh model:
after each refit every tensor the Triton kernel reads (the layer's float32 biases, the storage of its
triton_kernels weights and of the swizzled scales in the method's precision configs) equals that
model's bit for bit, and every object the kernel holds (the wrappers, precision configs, quant config,
kernel) and every tensor's storage is the one it had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from mxfp4_triton_harness import triton_backend, triton_objects, triton_tensors
from nvfp4_helpers import bits, dummy_started
from patchkit.patches.vllm.refit import RefitError, refit_weights
from patchkit.patches.vllm.refit._checks._mxfp4_moe import (
    GPT_OSS_HIDDEN,
    HIDDEN,
    INTERMEDIATE,
    Mxfp4Moe,
    checkpoint,
    first_load,
)
from patchkit.patches.vllm.refit._state import STATE_ATTR
from refit_driver import dropped, halved, refit_alternately, retyped
from vllm_fixtures import installed

PATCH = "vllm.mxfp4_moe_refit"
#: (hidden, intermediate) of the checkpoint, by id: one of triton_kernels' Hopper tiles, and gpt-oss's hidden
#: size (2880: not a multiple of the Hopper layouts' tiles, which pad inside the wrapper's storage)
SIZES = {"unpadded": (HIDDEN, INTERMEDIATE), "gpt-oss-hidden": (GPT_OSS_HIDDEN, 192)}


@pytest.fixture
def triton(vllm_config: object) -> Iterator[None]:
    with triton_backend("triton"):
        yield


@pytest.fixture
def mxfp4_refit_patch(triton: None) -> Iterator[None]:
    with installed(PATCH):
        yield


def items(weights: dict[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    return iter(list(weights.items()))


def started(kind: str, start: str, vllm_config: object, sizes: tuple[int, int]) -> Mxfp4Moe:
    if start == "dummy":
        return dummy_started(Mxfp4Moe(kind, *sizes), vllm_config)  # type: ignore[return-value]
    return first_load(kind, checkpoint(kind, 100, *sizes), "cpu", *sizes)


def differing(model: Mxfp4Moe, reference: Mxfp4Moe) -> list[str]:
    ours, theirs = triton_tensors(model.routed), triton_tensors(reference.routed)
    assert ours.keys() == theirs.keys()
    return [name for name, tensor in ours.items()
            if tensor.shape != theirs[name].shape or tensor.stride() != theirs[name].stride()
            or not torch.equal(bits(tensor.contiguous()), bits(theirs[name].contiguous()))]


def assert_same_as_first_load(model: Mxfp4Moe, weights: dict[str, torch.Tensor]) -> None:
    assert differing(model, first_load(model.kind, weights, "cpu", model.hidden, model.intermediate)) == []


def snapshot(model: Mxfp4Moe) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in triton_tensors(model.routed).items()}


def assert_unchanged(model: Mxfp4Moe, objects: dict[str, tuple[int, ...]], values: dict[str, torch.Tensor]) -> None:
    assert triton_objects(model.routed) == objects
    now = triton_tensors(model.routed)
    assert [name for name, tensor in values.items() if not torch.equal(bits(now[name]), bits(tensor))] == []


def test_vllm_picks_triton_for_gpt_oss_on_hopper_in_triton_kernels_layouts(vllm_config: object) -> None:
    """What the refit meets on Hopper: vLLM's own selection (``moe_backend="auto"``) puts gpt-oss on TRITON,
    whose weights become triton_kernels tensors in the Hopper layouts, off the layer's parameters."""
    with triton_backend("auto"):
        model = first_load("gpt_oss", checkpoint("gpt_oss", 1))
    method = model.routed.quant_method
    assert method.mxfp4_backend.name == "TRITON"
    assert type(vars(model.routed)["w13_weight"].storage.layout).__name__ == "HopperMXValueLayout"
    assert "w13_weight" not in dict(model.routed.named_parameters())
    assert model.routed.w13_bias.dtype == torch.float32


@pytest.mark.parametrize("sizes", list(SIZES.values()), ids=list(SIZES))
@pytest.mark.parametrize("start", ["load", "dummy"])
def test_refits_on_triton_equal_vllms_first_load_in_the_same_kernel_tensors(
    mxfp4_refit_patch: None, vllm_config: object, start: str, sizes: tuple[int, int]
) -> None:
    kind = "gpt_oss"
    model = started(kind, start, vllm_config, sizes)
    assert model.routed.quant_method.mxfp4_backend.name == "TRITON"
    refit_alternately(model, [checkpoint(kind, seed, *sizes) for seed in (1, 2)], 4,
                      lambda weights: assert_same_as_first_load(model, weights),
                      lambda m: triton_objects(m.routed))
    assert model.routed.__dict__[STATE_ATTR].backend == "TRITON"  # the record names the backend


_wrong_shape = halved("weight", dim=-1)
_wrong_dtype = retyped("weight", torch.bfloat16)
_missing_scale = dropped("weight_scale")


@pytest.mark.parametrize("spoil", [_wrong_shape, _wrong_dtype, _missing_scale],
                         ids=["wrong-shape", "wrong-dtype", "missing-scale"])
def test_a_bad_tensor_on_triton_changes_nothing(
    mxfp4_refit_patch: None, vllm_config: object, spoil: Callable[[dict[str, torch.Tensor]], str]
) -> None:
    kind, sizes = "gpt_oss", SIZES["gpt-oss-hidden"]
    model = started(kind, "load", vllm_config, sizes)
    objects, values = triton_objects(model.routed), snapshot(model)
    bad = checkpoint(kind, 3, *sizes)
    spoil(bad)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(bad))
    assert caught.value.parameter is not None
    assert_unchanged(model, objects, values)
    good = checkpoint(kind, 4, *sizes)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, good)
    assert triton_objects(model.routed) == objects


def test_a_failed_triton_processing_changes_nothing(
    mxfp4_refit_patch: None, vllm_config: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream processing raising part-way (after it deleted the staged weights): the layer keeps its
    triton_kernels weights, precision configs and values, and the next refit works."""
    from vllm.model_executor.layers.quantization.utils import mxfp4_utils

    sizes = SIZES["gpt-oss-hidden"]
    model = started("gpt_oss", "load", vllm_config, sizes)
    objects, values = triton_objects(model.routed), snapshot(model)
    oracle = pytest.importorskip("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
    calls = []

    def second_swizzle_fails(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("swizzle failed")
        return mxfp4_utils._swizzle_mxfp4(*args, **kwargs)

    monkeypatch.setattr(oracle, "_swizzle_mxfp4", second_swizzle_fails)
    with pytest.raises(RefitError, match="swizzle failed"):
        refit_weights(model, items(checkpoint("gpt_oss", 5, *sizes)))
    assert_unchanged(model, objects, values)
    monkeypatch.undo()
    good = checkpoint("gpt_oss", 6, *sizes)
    refit_weights(model, items(good))
    assert_same_as_first_load(model, good)
