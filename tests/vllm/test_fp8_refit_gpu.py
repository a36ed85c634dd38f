"""``vllm.fp8_refit`` on vLLM's real CUDA kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere). The CPU tests (``test_fp8_refit.py``) stand in for ``static_scaled_fp8_quant``; here
nothing is replaced: vLLM's own FP8 processing (per-tensor weights requantised to one scale by its
CUDA op, block-wise scales as they come) and the kernels vLLM picks on this GPU for the forward.
The layers are ``fp8_helpers``' (a fused ``gate_up`` and a ``down`` linear; a 4-expert fused-MoE
layer), per-tensor and block-wise (128 x 128). As verl runs it: a dummy start, a CUDA graph of the
forward captured, then refits of two checkpoints, alternating. After each: every kernel tensor at
its address, every kernel tensor equal bit for bit to vLLM's own first load of that checkpoint into a
fresh model, and the graph's replay equal bit for bit to an eager forward and to the fresh model's
forward. A refit with a wrong shape in the last layer raises ``RefitError`` and the graph serves the
old weights bit for bit.
"""

from __future__ import annotations

import pytest
from fp8_helpers import EXPERTS, HIDDEN, Fp8Linears, Fp8Moe, linear_checkpoint, moe_checkpoint
from gpu_kernels import GPU, format_refits_under_a_captured_graph

pytestmark = GPU

KINDS = {"linear": (Fp8Linears, linear_checkpoint), "moe": (Fp8Moe, moe_checkpoint)}
CASES = [pytest.param(kind, block, id=f"{kind}-{'block' if block else 'per-tensor'}")
         for kind in KINDS for block in (False, True)]


@pytest.mark.parametrize(("kind", "block"), CASES)
def test_fp8_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        vllm_config: object, kind: str, block: bool) -> None:
    states = [KINDS[kind][1](block, seed=seed) for seed in (1, 2)]
    format_refits_under_a_captured_graph(
        "vllm.fp8_refit", kind, lambda: KINDS[kind][0](block), states, vllm_config,
        hidden=HIDDEN, down_features=HIDDEN, experts=EXPERTS, label=f"{kind} {'block' if block else 'per-tensor'}")
