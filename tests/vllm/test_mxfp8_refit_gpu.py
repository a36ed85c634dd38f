"""``vllm.mxfp8_refit`` on vLLM's real CUDA kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere). Nothing is stood in: vLLM picks
its MXFP8 linear kernel and MoE backend for the GPU (Marlin on Hopper, FlashInfer on Blackwell), unlike
the CPU tests (``test_mxfp8_refit.py``), which run the emulation kernels. The layers are ``_checks._mxfp8``'s
(a fused ``gate_up`` and a ``down`` linear, vLLM 0.24-0.29 only here; a 4-expert fused-MoE layer) at
sizes GPU kernels take. ``gpu_kernels.refits_under_a_captured_graph`` drives it, as for FP8: a dummy
start, a CUDA graph captured, refits of two checkpoints alternating, each equal bit for bit to vLLM's own
first load (kernel tensors and served outputs), addresses kept, and a failed refit leaving the graph on
the old weights.
"""

from __future__ import annotations

import pytest
from gpu_kernels import GPU, format_refits_under_a_captured_graph
from patchkit.patches.vllm.refit._checks._mxfp8 import EXPERTS, MODELS, checkpoint, has_linear_method

pytestmark = GPU

HIDDEN, INTERMEDIATE = 256, 128


@pytest.mark.parametrize("kind", ["linear", "moe"])
def test_mxfp8_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        vllm_config: object, kind: str) -> None:
    if kind == "linear" and not has_linear_method():
        pytest.skip("ModelOptMxFp8LinearMethod exists in vLLM 0.16-0.29 only")
    states = [checkpoint(kind, seed, HIDDEN, INTERMEDIATE) for seed in (1, 2)]
    format_refits_under_a_captured_graph(
        "vllm.mxfp8_refit", kind, lambda: MODELS[kind](HIDDEN, INTERMEDIATE), states, vllm_config,
        hidden=HIDDEN, down_features=INTERMEDIATE, experts=EXPERTS, label=f"mxfp8 {kind}")
