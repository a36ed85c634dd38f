"""``megatron.fused_mla_yarn_non_pow2`` on the CPU: what can be shown without a GPU.

The kernels only run on CUDA (``test_fused_mla_yarn_non_pow2_gpu.py`` compares them with megatron-core's
unfused RoPE there). Here: the patch installs on every megatron-core in its range, MLA's fused entry point
``fused_apply_mla_rope_for_kv`` reaches the patched autograd function, reverting puts upstream's back,
and the doctor says its check needs a GPU.
"""

from __future__ import annotations

import pytest
from doctor_verdicts import verdict_of
from patchkit.patches.megatron.rope._checks._mla_yarn_kv import experimental_enabled

import patchkit
from patchkit.doctor import NEEDS_GPU

PATCH = "megatron.fused_mla_yarn_non_pow2"

pytestmark = pytest.mark.usefixtures("patches_restored")


def test_the_fused_kv_entry_point_reaches_the_patched_function(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core.fusions import fused_mla_yarn_rope_apply as fused

    upstream = fused.ApplyMLARotaryEmbKV
    with patchkit.applied(PATCH) as (record,):
        assert record.state.value == "applied", record.to_dict()
        patched = fused.ApplyMLARotaryEmbKV
        assert patched is not upstream
        assert patched.__module__.endswith("rope._fused_mla_yarn_non_pow2")
        calls = []
        monkeypatch.setattr(patched, "apply", lambda *args: calls.append(args) or ("key", "value"))
        with experimental_enabled():
            assert fused.fused_apply_mla_rope_for_kv("kv", "emb", "cos", "sin", 64, 192, 128) == ("key", "value")
        assert calls == [("kv", "emb", "cos", "sin", 64, 192, 128, None, 0, 1, False)]
    assert fused.ApplyMLARotaryEmbKV is upstream


def test_on_the_cpu_the_check_needs_a_gpu() -> None:
    verdict = verdict_of(PATCH, applied=True)
    assert verdict.verdict == NEEDS_GPU, verdict.message
