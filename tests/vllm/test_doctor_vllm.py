"""`patchkit doctor` on the real vLLM (CPU emulation): the NVFP4 refit self-check verifies an export -> refit
round trip, and fails when the patch is bypassed (upstream's layer methods back in place); so do the
round-trip self-checks of the other refit formats (load -> refit -> refit back against vLLM's own first
loads; MXFP4 MoE on Marlin stand-ins, MXFP8 on vLLM's emulation kernels)."""

from __future__ import annotations

import pytest
import torch
from nvfp4_helpers import BLOCK, E2M1_VALUES, dequantize, export_nvfp4
from vllm_fixtures import installed

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.selfcheck import upstream_behaviour

pytestmark = pytest.mark.usefixtures("patches_restored")

PATCH = "vllm.nvfp4_refit"


@pytest.fixture
def applied_refit():
    with installed(PATCH):
        yield


def verdict_of():
    (verdict,) = run([PATCH], device="cpu")[0]
    return verdict


def test_export_writes_blocks_the_dequantiser_reads_back_within_half_a_step():
    weight = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * torch.logspace(-2, 1, 64)
    checkpoint = export_nvfp4("w", weight)
    back = dequantize(checkpoint["w.weight"], checkpoint["w.weight_scale"], checkpoint["w.weight_scale_2"])
    scale = (checkpoint["w.weight_scale"].float() * checkpoint["w.weight_scale_2"]).repeat_interleave(BLOCK, -1)
    assert checkpoint["w.weight"].shape == (8, 32) and checkpoint["w.weight"].dtype == torch.uint8
    assert bool(((back / scale).abs().unsqueeze(-1) - E2M1_VALUES).abs().amin(-1).max() < 1e-5)  # on the grid
    assert bool(((back - weight).abs() <= scale * 1.0 + 1e-6).all())  # within one E2M1 step (2 at the top)


def test_nvfp4_refit_check_is_verified(applied_refit):
    verdict = verdict_of()
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.nvfp4_refit")
def test_nvfp4_refit_check_fails_with_upstreams_layer_methods(applied_refit):
    with upstream_behaviour(PATCH):
        verdict = verdict_of()
    assert verdict.verdict == FAILED
    assert "refit with exported weights of vLLM's NVFP4 linear layers: expected the layers take the new weights, " \
        "found " in verdict.message, verdict.message


# --- vllm.nvfp4_marlin_w4a16 (opt-in) ---

MARLIN = "vllm.nvfp4_marlin_w4a16"


def test_marlin_w4a16_check_is_verified_and_the_refit_check_still_checks_w4a4_layers():
    # The doctor applies the opt-in option in its process; the refit check still builds W4A4 layers.
    found = {v.id: v for v in run([MARLIN, PATCH], device="cpu")[0]}
    assert {k: v.verdict for k, v in found.items()} == {MARLIN: VERIFIED, PATCH: VERIFIED}, \
        {k: v.message for k, v in found.items()}


@pytest.mark.breaks("vllm.nvfp4_marlin_w4a16")
def test_marlin_w4a16_check_fails_with_upstreams_config():
    with patchkit.applied(MARLIN), upstream_behaviour(MARLIN):
        (verdict,) = run([MARLIN], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert ("layers of an NVFP4 (W4A4) checkpoint run vLLM's W4A16 Marlin kernel (16-bit activations): expected "
            "{'up': 'MarlinNvFp4LinearKernel', 'down': 'MarlinNvFp4LinearKernel'}, found "
            "{'up': 'EmulationNvFp4LinearKernel', 'down': 'EmulationNvFp4LinearKernel'}") in verdict.message, \
        verdict.message


@pytest.mark.slow
def test_the_command_verifies_every_vllm_patch_in_a_fresh_process_without_the_test_harness():
    # As a user on a machine without CUDA runs it: no conftest selects vLLM's CPU platform first
    # (vLLM 0.24's PyPI wheel resolves none there, and its kernel table keys on the platform it
    # saw at import).
    import json
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "patchkit", "doctor", "--json", "--device", "cpu",
                           "--patch", "vllm.*"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}, cwd=os.path.dirname(__file__))
    verdicts = {p["id"]: (p["verdict"], p["message"]) for p in json.loads(done.stdout)["patches"]}
    # The MXFP4 MoE check selects vLLM's CPU platform itself and stands Marlin in; the LoRA check builds
    # vLLM's worker LoRA manager on the CPU platform; the MXFP8 check selects vLLM's emulation kernels for
    # both platforms 0.24's kernel table may key on: all verified on 0.24, 0.29, 0.33.
    expected = dict.fromkeys((MARLIN, PATCH, CT_NVFP4, CT_NVFP4_MOE, "vllm.serve_signals_main_thread",
                              "vllm.mxfp4_moe_refit", "vllm.lora_from_tensors", "vllm.mxfp8_refit",
                              "vllm.shm_broadcast_bind_retry", "vllm.engine_client_send_lock",
                              "vllm.openai_namespace_tool", "vllm.qwen3_5_text_config_defaults",
                              "vllm.radio_layerscale_loader", "vllm.eagle3_own_lm_head"), VERIFIED)
    # vLLM 0.24's PyPI wheel without CUDA resolves no platform at import; its NVFP4 MoE oracle then
    # finds no backend and the MoE check says it cannot run here (in-process, with the harness, it runs).
    moe = verdicts.pop("vllm.moe_expert_weight_loaders")[0]
    assert moe in (VERIFIED, "needs_gpu"), moe
    # The same for its FP8 kernel table (the FP8 linear layer cannot be built there).
    fp8 = verdicts.pop(FP8)
    assert fp8[0] in (VERIFIED, "needs_gpu"), fp8
    # Online FP8: verified where declared (the linear check on 0.24-0.33, the pow2 option on 0.29+, 0.24's own
    # MoE method on 0.24), not applicable elsewhere; 0.24's MoE backend may not be found without CUDA.
    for patch_id, allowed in ((FP8_ONLINE, (VERIFIED, "needs_gpu")), (FP8_ONLINE_POW2, (VERIFIED, "not_applicable")),
                              (FP8_ONLINE_MOE, (VERIFIED, "needs_gpu", "not_applicable"))):
        verdict = verdicts.pop(patch_id)
        assert verdict[0] in allowed, (patch_id, verdict)
    # The Ray executor patches: without Ray installed (these environments) vLLM's Ray executors cannot run, and
    # the checks say so (not applicable); 0.33's native runtime-env check needs only vLLM's env-var helper. On
    # 0.24-0.28 ray_executor_v2.py itself imports only with Ray: the store patch is not applicable, and vLLM
    # is not reported as an upstream that does not import.
    for patch_id in ("vllm.ray_worker_runtime_env", "vllm.ray_store_port_window"):
        verdict = verdicts.pop(patch_id)
        assert verdict[0] in (VERIFIED, "not_applicable"), (patch_id, verdict)
        assert verdict[0] == VERIFIED or "Ray is not installed" in verdict[1] or (
            "imports only with ray, which is not installed here" in verdict[1]), (patch_id, verdict)
    assert {k: v[0] for k, v in verdicts.items()} == expected, verdicts
    assert done.returncode == 0, done.stdout[-2000:]




# --- the refit formats whose self-check refits a second checkpoint and back ---

FP8 = "vllm.fp8_refit"
CT_NVFP4 = "vllm.compressed_tensors_nvfp4_refit"
CT_NVFP4_MOE = "vllm.compressed_tensors_nvfp4_moe_refit"
FP8_ONLINE = "vllm.fp8_online_refit"
FP8_ONLINE_MOE = "vllm.fp8_online_moe_refit"
FP8_ONLINE_POW2 = "vllm.fp8_online_pow2_scales"
ROUND_TRIP_CHECKED = (FP8, CT_NVFP4, CT_NVFP4_MOE, "vllm.mxfp4_moe_refit", "vllm.mxfp8_refit", FP8_ONLINE)


@pytest.mark.parametrize("patch_id", ROUND_TRIP_CHECKED)
def test_refit_round_trip_check_is_verified(patch_id):
    with patchkit.applied(patch_id):
        (verdict,) = run([patch_id], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


# What each check reports with upstream's layer (or MoE) methods back: the failed step's expected and
# found, and, where vLLM processes a layer as its last tensor loads, that the layer was processed unrecorded.
@pytest.mark.parametrize(("patch_id", "reported"), [
    pytest.param(FP8, ("refit with a second checkpoint of vLLM's FP8 linear layers: expected the layers take "
                       "the new weights, found RefitError",),
                 marks=pytest.mark.breaks("vllm.fp8_refit"),
                 id="vllm.fp8_refit"),
    pytest.param(CT_NVFP4, ("refit with a second checkpoint of vLLM's compressed-tensors NVFP4 linear layers: "
                            "expected the layers take the new weights, found RefitError",
                            "processed before patchkit recorded it"),
                 marks=pytest.mark.breaks("vllm.compressed_tensors_nvfp4_refit"),
                 id="vllm.compressed_tensors_nvfp4_refit"),
    pytest.param(CT_NVFP4_MOE, ("refit with a second checkpoint of vLLM's compressed-tensors NVFP4 moe layers: "
                                "expected the layers take the new weights, found RefitError",
                                "processed before patchkit recorded it"),
                 marks=pytest.mark.breaks("vllm.compressed_tensors_nvfp4_moe_refit"),
                 id="vllm.compressed_tensors_nvfp4_moe_refit"),
    pytest.param("vllm.mxfp4_moe_refit", ("refit with a second checkpoint of vLLM's MXFP4 MoE layer: expected "
                                          "the layer takes the new weights, found RefitError",),
                 marks=pytest.mark.breaks("vllm.mxfp4_moe_refit"),
                 id="vllm.mxfp4_moe_refit"),
    pytest.param("vllm.mxfp8_refit", ("refit with a second checkpoint of vLLM's ModelOpt MXFP8 fused-MoE layer: "
                                      "expected the layer takes the new weights, found RefitError",
                                      "processed before patchkit recorded it"),
                 marks=pytest.mark.breaks("vllm.mxfp8_refit"),
                 id="vllm.mxfp8_refit"),
    pytest.param(FP8_ONLINE, ("refit with a second checkpoint of vLLM's online-FP8 linear layers: expected the "
                              "layers take the new weights, found RefitError",
                              "processed before patchkit recorded it"),
                 marks=pytest.mark.breaks("vllm.fp8_online_refit"),
                 id=FP8_ONLINE),
])
def test_refit_round_trip_check_fails_with_upstreams_layer_methods(patch_id, reported):
    with patchkit.applied(patch_id), upstream_behaviour(patch_id):
        (verdict,) = run([patch_id], device="cpu")[0]
    assert verdict.verdict == FAILED
    for fragment in reported:
        assert fragment in verdict.message, verdict.message


# --- vllm.fp8_online_pow2_scales (opt-in) ---


def test_pow2_scales_check_is_verified_where_declared():
    import vllm

    if vllm.__version__.startswith("0.24."):
        pytest.skip("vLLM 0.24's online FP8 derives its scales in a compiled op: the option is declared for 0.29+")
    with patchkit.applied(FP8_ONLINE_POW2):
        (verdict,) = run([FP8_ONLINE_POW2], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.fp8_online_pow2_scales")
def test_pow2_scales_check_fails_with_upstreams_scales():
    import vllm

    if vllm.__version__.startswith("0.24."):
        pytest.skip("declared for vLLM 0.29+")
    with patchkit.applied(FP8_ONLINE_POW2), upstream_behaviour(FP8_ONLINE_POW2):
        (verdict,) = run([FP8_ONLINE_POW2], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "power-of-two scales" in verdict.message, verdict.message


# --- vllm.fp8_online_moe_refit (vLLM 0.24's Fp8OnlineMoEMethod) ---


def _skip_unless_fp8_online_moe_method():
    from vllm.model_executor.layers.quantization import fp8

    if not hasattr(fp8, "Fp8OnlineMoEMethod"):
        pytest.skip("this vLLM has no Fp8OnlineMoEMethod (0.24 only)")


def test_fp8_online_moe_check_is_verified(cpu_fp8_ops):
    """In-process, with the harness's Triton experts listed for CPU (the MoE backend vLLM 0.24 finds there)."""
    _skip_unless_fp8_online_moe_method()
    with patchkit.applied(FP8_ONLINE_MOE):
        (verdict,) = run([FP8_ONLINE_MOE], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.fp8_online_moe_refit")
def test_fp8_online_moe_check_fails_with_upstreams_layer_methods(cpu_fp8_ops):
    _skip_unless_fp8_online_moe_method()
    with patchkit.applied(FP8_ONLINE_MOE), upstream_behaviour(FP8_ONLINE_MOE):
        (verdict,) = run([FP8_ONLINE_MOE], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "processed before patchkit recorded it" in verdict.message, verdict.message
