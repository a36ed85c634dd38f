"""``vllm.compressed_tensors_nvfp4_refit`` on vLLM's real CUDA kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels and the
``compressed-tensors`` package (skipped elsewhere). The CPU tests (``test_compressed_tensors_nvfp4_refit.py``)
run vLLM's NVFP4 emulation and stand in for Marlin's CUDA repack; here nothing is replaced: vLLM
processes the llm-compressor checkpoints (``nvfp4-pack-quantized``, W4A4 and W4A16) as it does on this
GPU and serves them with the kernels it picks. That includes the W4A16 fused MoE (``NVFP4A16`` on an MoE
model, verl's W4A16 QAT), which vLLM cannot build on CPU. The layers and checkpoints are the
self-check's (``ct_nvfp4_helpers``) at sizes Marlin takes. ``gpu_kernels.refits_under_a_captured_graph``
drives it: a dummy start, a CUDA graph captured, refits of two checkpoints alternating, each equal bit
for bit to vLLM's own first load (kernel tensors and served outputs), addresses kept, and a failed refit
leaving the graph on the old weights.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterator

import pytest
import torch
from ct_nvfp4_helpers import CtLinears, CtMoe, linear_checkpoint, moe_checkpoint
from gpu_kernels import GPU, Outputs, activations, forward_context, installed, refits_under_a_captured_graph

pytestmark = [
    *GPU,
    pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None, reason="needs compressed-tensors"),
]
logger = logging.getLogger(__name__)

#: Marlin's kernels take input features in multiples of 128 and output features in multiples of 64.
HIDDEN, INTERMEDIATE = 256, 128

KINDS = {
    "linear": (CtLinears, linear_checkpoint),
    "moe": (CtMoe, moe_checkpoint),
}
CASES = [pytest.param(kind, a16, id=f"{kind}-{'w4a16' if a16 else 'w4a4'}") for kind in KINDS for a16 in (False, True)]


@pytest.fixture
def ct_nvfp4_refit_on_gpu() -> Iterator[None]:
    with installed("vllm.compressed_tensors_nvfp4_refit"):
        yield


def forward_of(kind: str, vllm_config: object):
    """The forward a captured graph runs: bf16 activations through every layer of the model."""
    if kind == "linear":
        x_up, x_down = activations(16, HIDDEN, seed=4), activations(16, INTERMEDIATE, seed=5)

        def linear_forward(model: torch.nn.Module) -> Outputs:
            return model.gate_up(x_up)[0], model.down(x_down)[0]

        return linear_forward
    x, logits = activations(16, HIDDEN, seed=6), activations(16, 4, seed=7)

    def moe_forward(model: torch.nn.Module) -> Outputs:
        with forward_context(vllm_config):
            return (model.experts(x, logits),)

    return moe_forward


def _method(model: torch.nn.Module) -> str:
    layer = model.gate_up if hasattr(model, "gate_up") else model.routed
    method = layer.quant_method
    scheme = getattr(layer, "scheme", None)
    parts = [type(method).__name__, type(scheme).__name__ if scheme is not None else ""]
    for owner in (method, scheme):
        for attribute in ("kernel", "backend", "nvfp4_backend", "fp4_backend"):
            value = getattr(owner, attribute, None)
            if value is not None:
                parts.append(f"{attribute}={type(value).__name__ if not isinstance(value, (str, int)) else value}"
                             f"{'' if isinstance(value, (str, int)) else ':' + str(value)}")
    return " ".join(p for p in parts if p)


@pytest.mark.parametrize(("kind", "a16"), CASES)
def test_ct_nvfp4_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        ct_nvfp4_refit_on_gpu: None, vllm_config: object, kind: str, a16: bool) -> None:
    build, checkpoint = KINDS[kind]
    states = [checkpoint(a16, seed, hidden=HIDDEN, intermediate=INTERMEDIATE) for seed in (1, 2)]
    # An NVFP4A16 MoE layer registers input global scales its checkpoint lacks and Marlin never reads.
    placeholders = frozenset({"w13_input_global_scale", "w2_input_global_scale"} if kind == "moe" and a16 else ())
    model = refits_under_a_captured_graph(lambda: build(a16, hidden=HIDDEN, intermediate=INTERMEDIATE), states,
                                          forward_of(kind, vllm_config), vllm_config, placeholders=placeholders)
    logger.info("%s %s: %s", kind, "w4a16" if a16 else "w4a4", _method(model))
