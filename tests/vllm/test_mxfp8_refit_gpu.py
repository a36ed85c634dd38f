"""``vllm.mxfp8_refit`` on vLLM's real CUDA kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere); **not run yet** (written in session 8, no GPU for helpers). Nothing is stood in: vLLM picks
its MXFP8 linear kernel and MoE backend for the GPU (Marlin on Hopper, FlashInfer on Blackwell), unlike
the CPU tests (``test_mxfp8_refit.py``), which run the emulation kernels. The layers are ``_checks._mxfp8``'s
(a fused ``gate_up`` and a ``down`` linear, vLLM 0.24-0.29 only here; a 4-expert fused-MoE layer). As verl
and NeMo-RL run it: a dummy start, a CUDA graph of the forward captured, then refits of two checkpoints,
alternating. After each: every kernel tensor at its address and equal bit for bit to vLLM's own first
load of that checkpoint into a fresh model, and the graph's replay equal bit for bit to an eager forward
and to the fresh model's forward. A refit with a wrong shape raises ``RefitError`` and the graph serves
the old weights bit for bit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
from gpu_kernels import GPU, Outputs, activations, capture, forward_context, installed, kernel_tensors, on_gpu, replay
from nvfp4_helpers import bits, dummy_started, process_weights_after_loading
from patchkit.patches.vllm._checks._mxfp8 import EXPERTS, HIDDEN, INTERMEDIATE, MODELS, checkpoint, has_linear_method
from patchkit.patches.vllm.refit import RefitError, refit_weights

pytestmark = GPU
logger = logging.getLogger(__name__)


@pytest.fixture
def mxfp8_refit_on_gpu() -> Iterator[None]:
    with installed("vllm.mxfp8_refit"):
        yield


def first_load(kind: str, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
    with torch.device("cuda"):
        model = MODELS[kind]()
    model.load_weights(iter(on_gpu(weights)))
    process_weights_after_loading(model)
    return model


def forward_of(kind: str, vllm_config: object):
    if kind == "linear":
        x_up, x_down = activations(16, HIDDEN, seed=4), activations(16, INTERMEDIATE, seed=5)

        def linear_forward(model: torch.nn.Module) -> Outputs:
            return model.gate_up(x_up)[0], model.down(x_down)[0]

        return linear_forward
    x, logits = activations(16, HIDDEN, seed=6), activations(16, EXPERTS, seed=7)

    def moe_forward(model: torch.nn.Module) -> Outputs:
        with forward_context(vllm_config):
            return (model.experts(x, logits),)

    return moe_forward


def assert_same_tensors(model: torch.nn.Module, reference: torch.nn.Module, step: int) -> None:
    ours = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    theirs = {**dict(reference.named_parameters()), **dict(reference.named_buffers())}
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert (ours[name].shape, ours[name].dtype) == (tensor.shape, tensor.dtype), name
        assert torch.equal(bits(ours[name]), bits(tensor)), f"refit {step}: {name} differs from vLLM's first load"


@pytest.mark.parametrize("kind", ["linear", "moe"])
def test_mxfp8_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        mxfp8_refit_on_gpu: None, vllm_config: object, kind: str) -> None:
    if kind == "linear" and not has_linear_method():
        pytest.skip("ModelOptMxFp8LinearMethod exists in vLLM 0.16-0.29 only")
    states = [checkpoint(kind, seed=seed) for seed in (1, 2)]
    with torch.device("cuda"):
        model = dummy_started(MODELS[kind](), vllm_config)
    forward = forward_of(kind, vllm_config)
    pointers = kernel_tensors(model)
    graph, outputs = capture(lambda: forward(model))
    for step in range(6):
        weights = states[step % 2]
        refit_weights(model, on_gpu(weights))
        assert kernel_tensors(model) == pointers, f"refit {step} moved kernel tensors"
        fresh = first_load(kind, weights)
        assert_same_tensors(model, fresh, step)
        served = replay(graph, outputs)
        for got, eager, theirs in zip(served, forward(model), forward(fresh), strict=True):
            assert torch.isfinite(got.float()).all() and got.abs().sum() > 0, f"refit {step}"
            assert torch.equal(got, eager), f"refit {step}: the graph does not serve what eager forward does"
            assert torch.equal(got, theirs), f"refit {step}: the refit serves other outputs than vLLM's first load"
    before = replay(graph, outputs)
    broken = dict(states[0])
    last = next(n for n in reversed(broken) if n.endswith(".weight"))
    broken[last] = broken[last][:, : broken[last].shape[1] // 2].contiguous()
    with pytest.raises(RefitError):
        refit_weights(model, on_gpu(broken))
    assert kernel_tensors(model) == pointers
    for got, want in zip(replay(graph, outputs), before, strict=True):
        assert torch.equal(got, want), "a failed refit changed what the graph serves"
