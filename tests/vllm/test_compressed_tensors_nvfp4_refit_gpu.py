"""``vllm.compressed_tensors_nvfp4_refit`` on vLLM's real CUDA kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels and the
``compressed-tensors`` package (skipped elsewhere). The CPU tests (``test_compressed_tensors_nvfp4_refit.py``)
run vLLM's NVFP4 emulation and stand in for Marlin's CUDA repack; here nothing is replaced: vLLM
processes the llm-compressor checkpoints (``nvfp4-pack-quantized``, W4A4 and W4A16) as it does on this
GPU and serves them with the kernels it picks. That includes the W4A16 fused MoE (``NVFP4A16`` on an MoE
model, verl's W4A16 QAT), which vLLM cannot build on CPU. The layers and checkpoints are the
self-check's (``refit._checks._ct_nvfp4_checkpoint``) at sizes Marlin takes.
``gpu_kernels.refits_under_a_captured_graph`` drives it: a dummy start, a CUDA graph captured, refits
of two checkpoints alternating, each equal bit for bit to vLLM's own first load (kernel tensors and
served outputs), addresses kept, and a failed refit leaving the graph on the old weights.
"""

from __future__ import annotations

import importlib.util

import pytest
from gpu_kernels import GPU, format_refits_under_a_captured_graph
from patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint import (
    EXPERTS,
    CtLinears,
    CtMoe,
    linear_checkpoint,
    moe_checkpoint,
)

pytestmark = [
    *GPU,
    pytest.mark.skipif(importlib.util.find_spec("compressed_tensors") is None, reason="needs compressed-tensors"),
]

#: Marlin's kernels take input features in multiples of 128 and output features in multiples of 64.
HIDDEN, INTERMEDIATE = 256, 128

KINDS = {
    "linear": (CtLinears, linear_checkpoint),
    "moe": (CtMoe, moe_checkpoint),
}
CASES = [pytest.param(kind, a16, id=f"{kind}-{'w4a16' if a16 else 'w4a4'}") for kind in KINDS for a16 in (False, True)]


@pytest.mark.parametrize(("kind", "a16"), CASES)
def test_ct_nvfp4_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        vllm_config: object, kind: str, a16: bool) -> None:
    build, checkpoint = KINDS[kind]
    states = [checkpoint(a16, seed, hidden=HIDDEN, intermediate=INTERMEDIATE) for seed in (1, 2)]
    # An NVFP4A16 MoE layer registers input global scales its checkpoint lacks and Marlin never reads.
    placeholders = frozenset({"w13_input_global_scale", "w2_input_global_scale"} if kind == "moe" and a16 else ())
    # The fused-MoE methods are recorded by a patch of their own.
    patch_id = "vllm.compressed_tensors_nvfp4_moe_refit" if kind == "moe" else "vllm.compressed_tensors_nvfp4_refit"
    format_refits_under_a_captured_graph(
        patch_id, kind, lambda: build(a16, hidden=HIDDEN, intermediate=INTERMEDIATE),
        states, vllm_config, hidden=HIDDEN, down_features=INTERMEDIATE, experts=EXPERTS,
        label=f"{kind} {'w4a16' if a16 else 'w4a4'}", placeholders=placeholders)
