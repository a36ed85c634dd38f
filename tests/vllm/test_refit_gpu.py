"""Refit on vLLM's real CUDA kernels (Marlin), with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere). As verl and NeMo-RL run it: the model starts with vLLM's dummy loader, a CUDA graph of
its forward is captured, then ``refit_weights`` pushes ModelOpt NVFP4 exports of two trained states,
alternating, ten times. The exports are made in-test from bf16 "trained" weights by the independent
quantiser of ``_nvfp4_checkpoint`` (what ``export_qat_weights`` writes; Megatron is not loaded in
this process). After every refit: every kernel tensor keeps its address, the captured graph replays
the new weights (equal, bit for bit, to an eager forward and to vLLM's own first load of the same
export) and its outputs equal the QAT product within the bf16 bound of ``gpu_kernels``. A refit
that fails leaves the graph serving the old weights, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from gpu_kernels import (
    GPU,
    HIDDEN,
    INTERMEDIATE,
    DenseLayers,
    MoELayer,
    Outputs,
    activations,
    assert_within,
    capture,
    export,
    fake_quantized,
    forward_context,
    installed,
    kernel_tensors,
    linear_expected,
    loaded,
    moe_expected,
    on_gpu,
    replay,
    trained_dense,
    trained_moe,
)
from nvfp4_helpers import dummy_started
from patchkit.patches.vllm.refit import RefitError, refit_weights

pytestmark = GPU


@pytest.fixture(params=["w4a4-checkpoint-on-marlin", "w4a16-patch"])
def refit_patches(request: pytest.FixtureRequest) -> Iterator[None]:
    """``vllm.nvfp4_refit``, with or without ``vllm.nvfp4_marlin_w4a16`` (on Hopper both serve on Marlin)."""
    patches = ["vllm.nvfp4_refit"] + (["vllm.nvfp4_marlin_w4a16"] if request.param == "w4a16-patch" else [])
    with installed(*patches):
        yield


def refit_ten_times_then_fail(
    model: torch.nn.Module,
    forward: Callable[[], Outputs],
    states: list[dict[str, torch.Tensor]],
    check: Callable[[Outputs, dict[str, torch.Tensor]], None],
    first_load: Callable[[dict[str, torch.Tensor]], Outputs],
    broken: dict[str, torch.Tensor],
) -> None:
    pointers = kernel_tensors(model)
    graph, outputs = capture(forward)
    for step in range(10):
        checkpoint = states[step % 2]
        refit_weights(model, on_gpu(checkpoint))
        assert kernel_tensors(model) == pointers, f"refit {step} moved kernel tensors"
        served = replay(graph, outputs)
        eager = forward()
        reference = first_load(checkpoint)
        for got, want, fresh in zip(served, eager, reference, strict=True):
            assert torch.equal(got, want), f"refit {step}: the graph does not serve what eager forward does"
            assert torch.equal(got, fresh), f"refit {step}: the refit differs from vLLM's first load"
        check(served, checkpoint)
    before = replay(graph, outputs)
    with pytest.raises(RefitError):
        refit_weights(model, on_gpu(broken))
    assert kernel_tensors(model) == pointers
    for got, want in zip(replay(graph, outputs), before, strict=True):
        assert torch.equal(got, want), "a failed refit changed what the graph serves"


def test_dense_refits_on_marlin_keep_addresses_and_the_captured_graph(
        refit_patches: None, vllm_config: object) -> None:
    states = [export(trained_dense(seed)) for seed in (1, 2)]
    with torch.device("cuda"):
        model = dummy_started(DenseLayers("NVFP4"), vllm_config)
    x_up, x_down = activations(16, HIDDEN, seed=4), activations(16, INTERMEDIATE, seed=5)

    def forward(layers: torch.nn.Module = model) -> Outputs:
        return layers.up(x_up)[0], layers.down(x_down)[0]

    def first_load(checkpoint: dict[str, torch.Tensor]) -> Outputs:
        with torch.device("cuda"):
            return forward(loaded(DenseLayers("NVFP4"), checkpoint))

    def check(served: Outputs, checkpoint: dict[str, torch.Tensor]) -> None:
        assert_within(served[0], linear_expected(x_up, fake_quantized(checkpoint, "up")), "up")
        assert_within(served[1], linear_expected(x_down, fake_quantized(checkpoint, "down")), "down")

    broken = dict(states[0])
    broken["down.weight"] = broken["down.weight"][:, :-8]  # the last layer's weight of the wrong shape
    refit_ten_times_then_fail(model, forward, states, check, first_load, broken)


def test_moe_refits_on_marlin_keep_addresses_and_the_captured_graph(
        refit_patches: None, vllm_config: object) -> None:
    states = [export(trained_moe(seed)) for seed in (1, 2)]
    with torch.device("cuda"):
        model = dummy_started(MoELayer("NVFP4"), vllm_config)
    x, logits = activations(24, HIDDEN, seed=6), activations(24, 4, seed=7)

    def forward(layer: MoELayer = model) -> Outputs:
        with forward_context(vllm_config):
            return (layer.experts(x, logits),)

    def first_load(checkpoint: dict[str, torch.Tensor]) -> Outputs:
        with torch.device("cuda"):
            return forward(loaded(MoELayer("NVFP4"), checkpoint))

    def check(served: Outputs, checkpoint: dict[str, torch.Tensor]) -> None:
        assert_within(served[0], moe_expected(x, logits, checkpoint), "moe")

    broken = dict(states[0])
    broken["experts.3.down_proj.weight_scale"] = broken["experts.3.down_proj.weight_scale"][:, :-1]
    refit_ten_times_then_fail(model, forward, states, check, first_load, broken)
