"""Refit patches install whenever their layers can be built, and a reverted one refits nothing.

Written the way a user meets it: ``patchkit.apply_all()`` first, then vLLM builds a model in a fresh
process, importing only what that model needs. A dense compressed-tensors NVFP4 model never imports
vLLM's NVFP4 MoE module (vLLM imports it only to build an NVFP4 MoE layer): its linear layers must be
recorded and refittable all the same, and nothing a refit checks may import that module.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch
from fresh_process import last_printed
from nvfp4_helpers import assert_same_kernel_state, bits, kernel_state
from patchkit.patches.vllm.refit import RefitError, refit_weights
from refit_formats import format_started

HERE = Path(__file__).parent
MOE_MODULE = ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
              "compressed_tensors_moe_w4a4_nvfp4")

DENSE_CT_MODEL = f"""
import json, sys, tempfile
from pathlib import Path
import patchkit
patchkit.apply_all()
sys.path.insert(0, {str(HERE)!r})
import vllm_cpu_harness
vllm_cpu_harness.select_cpu_platform()
from patchkit.patches.vllm._checks._cpu_stand_in import cpu_nvfp4_kernels
from patchkit.patches.vllm.refit import refit_weights
from patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint import CtLinears, linear_checkpoint
from nvfp4_helpers import dummy_started

result = {{}}
with vllm_cpu_harness.vllm_cpu_config(Path(tempfile.mkdtemp())) as config, cpu_nvfp4_kernels():
    model = dummy_started(CtLinears(a16=False), config)
    result["moe_module_imported_by_the_model"] = {MOE_MODULE!r} in sys.modules
    try:
        refit_weights(model, list(linear_checkpoint(False, seed=1).items()))
    except Exception as exc:
        result["refit"] = f"{{type(exc).__name__}}: {{exc}}"
    else:
        result["refit"] = "ok"
    result["states"] = {{r.id: r.state.value for r in patchkit.status("vllm.compressed_tensors_nvfp4*")}}
    result["moe_module_imported_after_the_refit"] = {MOE_MODULE!r} in sys.modules
print(json.dumps(result))
"""


def test_a_dense_compressed_tensors_nvfp4_model_is_recorded_and_refitted_in_a_fresh_process() -> None:
    result = last_printed(textwrap.dedent(DENSE_CT_MODEL), without=("PATCHKIT_", "VLLM_PLUGINS"), timeout=540,
                          check=True, VLLM_TARGET_DEVICE="cpu")
    assert result["refit"] == "ok", result
    assert result["states"]["vllm.compressed_tensors_nvfp4_refit"] == "applied", result
    assert result["states"]["vllm.compressed_tensors_nvfp4_moe_refit"] == "pending", result  # waits, harmlessly
    assert not result["moe_module_imported_after_the_refit"], result


@pytest.mark.parametrize("fmt", ["fp8-linear", "ct-nvfp4-linear", "modelopt-nvfp4-moe", "mxfp4-moe"])
def test_a_reverted_refit_patch_leaves_no_layer_refittable_through_it(
    request: pytest.FixtureRequest, fmt: str
) -> None:
    import patchkit

    with format_started(request, fmt) as (case, model):
        refit_weights(model, list(case.checkpoint(1).items()))
        before = kernel_state(model)
        recording = case.patches()[-1] if case.moe else case.patches()[0]
        patchkit.revert(recording)
        # refused by name, or (no refit patch left installed) refused whole
        with pytest.raises(RefitError, match=rf"recorded by patch {recording!r}, which is no longer installed"
                                             r"|refit is unavailable"):
            refit_weights(model, list(case.checkpoint(2).items()))
        assert_same_kernel_state(model, before)
        patchkit.apply(recording)
        assert patchkit.why_not_installed(recording) is None
        refit_weights(model, list(case.checkpoint(2).items()))  # applied again: refittable again
        after = kernel_state(model)
        assert not all(torch.equal(bits(after[n][1]), bits(before[n][1])) for n in before)
