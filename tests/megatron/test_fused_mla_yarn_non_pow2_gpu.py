"""``megatron.fused_mla_yarn_non_pow2`` on a CUDA GPU: MLA's fused YaRN RoPE for key and value (Triton)
against megatron-core's unfused path.

Run with ``pytest -m gpu tests/megatron``; skipped without CUDA. The driver
(``patches/megatron/rope/_checks/_mla_yarn_kv.py``) runs upstream's ``fused_apply_mla_rope_for_kv`` on the
cos/sin table of upstream's ``YarnRotaryEmbedding`` and upstream's unfused ``apply_rotary_pos_emb`` on
the same tensors, forward and backward, SBHD and packed THD. Without the patch a ``k_dim`` that is not a
power of two does not compile (``tl.arange(0, 192)``); with it every case equals the unfused path. The
unchanged cases (``k_dim`` 128) show the patched kernels still equal the unfused path where upstream's
already ran.
"""

from __future__ import annotations

import logging

import pytest
import torch
from patchkit.patches.megatron.rope._checks._mla_yarn_kv import KVShape, compare

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

PATCH = "megatron.fused_mla_yarn_non_pow2"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (Triton kernels)"),
    pytest.mark.usefixtures("patches_restored"),
]

logger = logging.getLogger(__name__)

#: Relative to ``1 + |unfused|``: float32 differs only in the order of the heads' sum in the RoPE key's
#: gradient; bfloat16 rounds the fused kernel's products once more (megatron-core's own test of the
#: kernel allows 2e-2 relative and 5e-2 absolute in bfloat16).
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}

#: (k_dim, v_dim, heads): no-RoPE widths of 192 and 96 with values of 128 and 256, head counts a block of
#: 8 or 16 does not divide (20, 12) and one it does (16).
NON_POW2 = [(192, 128, 20), (192, 256, 16), (96, 128, 12)]
POW2 = [(128, 128, 16), (128, 128, 20)]


def _shapes(dims: list[tuple[int, int, int]], layouts: tuple[bool, ...] = (False, True)) -> list[KVShape]:
    return [KVShape(k, v, heads, packed) for k, v, heads in dims for packed in layouts]


def _id(shape: KVShape) -> str:
    return f"k{shape.k_dim}-v{shape.v_dim}-h{shape.heads}-{'thd' if shape.packed else 'sbhd'}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
# No value (v_dim 0), as slime's kernels allow: packed THD only (upstream's SBHD reshape of an empty value
# tensor with -1 is ambiguous, with or without the patch).
@pytest.mark.parametrize("shape", _shapes(NON_POW2 + POW2) + _shapes([(192, 0, 20)], (True,)), ids=_id)
def test_fused_kv_rope_equals_the_unfused_path(shape: KVShape, dtype: torch.dtype) -> None:
    with patchkit.applied(PATCH) as (record,):
        assert record.state.value == "applied", record.to_dict()
        comparison = compare(shape, dtype)
    assert comparison.error is None, comparison.error
    logger.info("%s %s: largest relative differences %s", shape, dtype, comparison.differences)
    assert comparison.largest() <= TOLERANCE[dtype], comparison.differences


@pytest.mark.parametrize("shape", _shapes([(192, 128, 20)]), ids=_id)
def test_without_the_patch_a_non_power_of_two_k_dim_does_not_compile(shape: KVShape) -> None:
    comparison = compare(shape, torch.float32)
    assert comparison.error is not None and "power of 2" in comparison.error, comparison


@pytest.mark.parametrize("shape", _shapes([(128, 128, 16)]), ids=_id)
def test_without_the_patch_a_power_of_two_k_dim_already_equals_the_unfused_path(shape: KVShape) -> None:
    comparison = compare(shape, torch.float32)
    assert comparison.error is None and comparison.largest() <= TOLERANCE[torch.float32], comparison


def test_check_is_verified_on_the_gpu() -> None:
    with patchkit.applied(PATCH):
        (verdict,) = run([PATCH], device="cuda")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("megatron.fused_mla_yarn_non_pow2")
def test_check_fails_with_upstreams_kernels() -> None:
    with patchkit.applied(PATCH), upstream_behaviour(PATCH):
        (verdict,) = run([PATCH], device="cuda")[0]
    assert verdict.verdict == FAILED
    assert "power of 2" in verdict.message, verdict.message
