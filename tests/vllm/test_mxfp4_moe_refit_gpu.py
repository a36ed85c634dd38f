"""``vllm.mxfp4_moe_refit`` on vLLM's real Marlin kernels, with a CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped
elsewhere). The CPU tests (``test_mxfp4_moe_refit.py``) stand in for Marlin's device check and its
CUDA repack; here nothing is replaced: the layer (gpt-oss's ``GptOssMxfp4Config`` and the canonical
``Mxfp4Config``) is built on vLLM's ``MARLIN`` MXFP4 backend (``marlin_backend("cuda")`` only chooses
it, as ``--moe-backend marlin`` does), processed by its own repack and served by its Marlin MoE kernel.
Sizes: Marlin's tiles unpadded, and gpt-oss-20b/120b's own hidden and intermediate sizes (2880 each,
padded by vLLM to 3072 and 2944) with four experts. ``gpu_kernels.refits_under_a_captured_graph`` drives
it: a dummy start, a CUDA graph captured, refits of two checkpoints alternating, each equal bit for bit
to vLLM's own first load (kernel tensors and served outputs), addresses kept, and a failed refit leaving
the graph on the old weights.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from gpu_kernels import GPU, experts_forward, installed, quant_method_in_use, refits_under_a_captured_graph
from patchkit.patches.vllm.refit._checks._mxfp4_moe import (
    EXPERTS,
    GPT_OSS_HIDDEN,
    GPT_OSS_INTERMEDIATE,
    HIDDEN,
    INTERMEDIATE,
    KINDS,
    Mxfp4Moe,
    checkpoint,
    marlin_backend,
)

pytestmark = GPU
logger = logging.getLogger(__name__)

SIZES = {"unpadded": (HIDDEN, INTERMEDIATE), "gpt-oss-20b-sizes": (GPT_OSS_HIDDEN, GPT_OSS_INTERMEDIATE)}


@pytest.fixture
def mxfp4_refit_on_marlin(vllm_config: object) -> Iterator[None]:
    with installed("vllm.mxfp4_moe_refit"), marlin_backend("cuda"):
        yield


@pytest.mark.parametrize("sizes", list(SIZES), ids=list(SIZES))
@pytest.mark.parametrize("kind", KINDS)
def test_mxfp4_refits_on_marlin_equal_vllms_first_load_under_a_captured_graph(
        mxfp4_refit_on_marlin: None, vllm_config: object, kind: str, sizes: str) -> None:
    hidden, intermediate = SIZES[sizes]
    states = [checkpoint(kind, seed, hidden, intermediate) for seed in (1, 2)]
    model = refits_under_a_captured_graph(lambda: Mxfp4Moe(kind, hidden, intermediate), states,
                                          experts_forward(hidden, EXPERTS, vllm_config), vllm_config)
    logger.info("%s %s: %s, w13 %s", kind, sizes, quant_method_in_use(model), tuple(model.routed.w13_weight.shape))
