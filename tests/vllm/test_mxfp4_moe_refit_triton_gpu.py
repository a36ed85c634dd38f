"""``vllm.mxfp4_moe_refit`` on vLLM's real TRITON MXFP4 MoE backend (triton_kernels' fused MoE) on a Hopper GPU,
with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm/test_mxfp4_moe_refit_triton_gpu.py`` on an SM90 GPU (H100/H200) with
vLLM's CUDA wheel; skipped without CUDA, on other GPUs, or where ``triton_kernels`` does not import (vLLM
ships it in its wheel as ``vllm.third_party.triton_kernels``; a ``triton_kernels`` install takes precedence).
Nothing is stood in: vLLM's own selection (``moe_backend="auto"``) must pick TRITON for the gpt-oss layer,
as it does on Hopper; its processing runs ``_swizzle_mxfp4`` with vLLM's SM90 branch and triton_kernels'
Hopper layouts; its Triton kernel serves the forward. The CPU tests (``test_mxfp4_moe_refit_triton.py``)
cover the rest.

As verl runs a refit: a dummy start, a CUDA graph of the layer's forward captured, then refits of two
checkpoints in turn. After each: every tensor the kernel reads (float32 biases, the storage of the
triton_kernels weights and of the swizzled scales in the precision configs) equal bit for bit to vLLM's own
first load of that checkpoint into a fresh layer; every object the kernel holds and every address kept; the
graph's replay equal bit for bit to an eager forward and to the fresh layer's forward. Then a wrong shape
raises ``RefitError`` and the graph serves the old weights bit for bit. Sizes: a small one, and gpt-oss-20b/120b's
hidden and intermediate sizes (2880 each) with four experts.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from gpu_kernels import GPU, built_as_vllm_builds, capture, experts_forward, installed, on_gpu, replay
from mxfp4_triton_harness import triton_backend, triton_objects, triton_tensors
from nvfp4_helpers import bits, dummy_started, process_weights_after_loading
from patchkit.patches.vllm.refit import RefitError, refit_weights
from patchkit.patches.vllm.refit._checks._mxfp4_moe import (
    EXPERTS,
    GPT_OSS_HIDDEN,
    GPT_OSS_INTERMEDIATE,
    HIDDEN,
    INTERMEDIATE,
    Mxfp4Moe,
    checkpoint,
)

logger = logging.getLogger(__name__)


def _on_hopper_with_triton_kernels() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return False
    from vllm.utils.import_utils import has_triton_kernels

    return has_triton_kernels()


pytestmark = [
    *GPU,
    pytest.mark.skipif(not _on_hopper_with_triton_kernels(),
                       reason="needs an SM90 GPU (H100/H200) and triton_kernels (shipped in vLLM's wheel)"),
]

SIZES = {"small": (HIDDEN, INTERMEDIATE), "gpt-oss-20b-sizes": (GPT_OSS_HIDDEN, GPT_OSS_INTERMEDIATE)}


@pytest.fixture
def mxfp4_refit_on_triton(vllm_config: object) -> Iterator[None]:
    with installed("vllm.mxfp4_moe_refit"), triton_backend("auto", device="cuda"):
        yield


def _first_load(weights: dict[str, torch.Tensor], hidden: int, intermediate: int) -> Mxfp4Moe:
    with built_as_vllm_builds():
        fresh = Mxfp4Moe("gpt_oss", hidden, intermediate)
    fresh.load_weights(on_gpu(weights))
    process_weights_after_loading(fresh)
    return fresh


def _differing(model: Mxfp4Moe, reference: Mxfp4Moe) -> list[str]:
    ours, theirs = triton_tensors(model.routed), triton_tensors(reference.routed)
    assert ours.keys() == theirs.keys()
    return [name for name, tensor in ours.items()
            if (tensor.shape, tensor.stride(), tensor.dtype) != (theirs[name].shape, theirs[name].stride(),
                                                                 theirs[name].dtype)
            or not torch.equal(bits(tensor.contiguous()), bits(theirs[name].contiguous()))]


@pytest.mark.parametrize("sizes", list(SIZES), ids=list(SIZES))
def test_gpt_oss_refits_on_triton_equal_vllms_first_load_under_a_captured_graph(
        mxfp4_refit_on_triton: None, vllm_config: object, sizes: str) -> None:
    hidden, intermediate = SIZES[sizes]
    states = [checkpoint("gpt_oss", seed, hidden, intermediate) for seed in (1, 2)]
    forward = experts_forward(hidden, EXPERTS, vllm_config)
    with built_as_vllm_builds():
        model = dummy_started(Mxfp4Moe("gpt_oss", hidden, intermediate), vllm_config)
    method = model.routed.quant_method
    assert method.mxfp4_backend.name == "TRITON", f"vLLM picked {method.mxfp4_backend} on this GPU"
    held = triton_objects(model.routed)
    graph, outputs = capture(lambda: forward(model))
    for step in range(4):
        weights = states[step % 2]
        refit_weights(model, on_gpu(weights))
        assert triton_objects(model.routed) == held, f"refit {step} moved or replaced what the kernel holds"
        fresh = _first_load(weights, hidden, intermediate)
        assert _differing(model, fresh) == [], f"refit {step}"
        served = replay(graph, outputs)
        for got, eager, theirs in zip(served, forward(model), forward(fresh), strict=True):
            assert torch.isfinite(got.float()).all() and got.abs().sum() > 0, f"refit {step}"
            assert torch.equal(got, eager), f"refit {step}: the graph does not serve what eager forward does"
            assert torch.equal(got, theirs), f"refit {step}: the refit serves other outputs than vLLM's first load"
    assert not torch.equal(replay(graph, outputs)[0], forward(_first_load(states[0], hidden, intermediate))[0])
    before = replay(graph, outputs)
    broken = dict(states[0])
    broken["experts.w2_weight"] = broken["experts.w2_weight"][..., : broken["experts.w2_weight"].shape[-1] // 2]
    with pytest.raises(RefitError):
        refit_weights(model, on_gpu({k: v.contiguous() for k, v in broken.items()}))
    assert triton_objects(model.routed) == held
    for got, want in zip(replay(graph, outputs), before, strict=True):
        assert torch.equal(got, want), "a failed refit changed what the graph serves"
    logger.info("gpt-oss %s on %s: w13 %s in %s", sizes, method.mxfp4_backend.name,
                tuple(vars(model.routed)["w13_weight"].storage.data.shape),
                type(vars(model.routed)["w13_weight"].storage.layout).__name__)
