"""``vllm.moe_expert_weight_loaders`` (native, vLLM 0.24-0.33): vLLM's own fused-MoE layer keeps the
``weight_loader`` on its expert parameters through processing, so the frameworks' re-attachment
(verl ``patch_vllm_moe_model_weight_loader``, ROLL) is not needed; and it is a no-op there anyway,
since ``mlp.experts`` has no ``weight_loader`` since the MoE factory."""

from __future__ import annotations

import pytest
import torch
from patchkit.patches.vllm._checks._tiny_moe import (
    TinyMoE,
    checkpoint,
    is_the_layers_loader,
    loaders_of,
    processed_tiny_moe,
)

import patchkit
from patchkit.doctor import FAILED, VERIFIED, run
from patchkit.runtime.status import Reason

pytestmark = pytest.mark.usefixtures("patches_restored")

PATCH = "vllm.moe_expert_weight_loaders"


def test_declared_native_on_this_release():
    with patchkit.applied(PATCH) as (record,):
        assert record.reason is Reason.NATIVE, record.to_dict()


def test_expert_parameters_are_created_with_the_routed_layers_loader(vllm_config):
    model = TinyMoE(quantized=False)
    loaders = loaders_of(model)
    assert {"w13_weight", "w2_weight"} <= set(loaders)
    assert all(is_the_layers_loader(loader, model.routed) for loader in loaders.values()), loaders
    # What verl's re-attachment reads: the container frameworks reach as mlp.experts has no loader.
    assert not hasattr(model.experts, "weight_loader")


def test_nvfp4_expert_parameters_keep_the_loader_through_vllms_processing(cpu_nvfp4_kernels):
    model = processed_tiny_moe("cpu", quantized=True)
    loaders = loaders_of(model)
    assert len(loaders) == 8  # w13/w2 x weight, weight_scale, weight_scale_2, input_scale
    assert all(is_the_layers_loader(loader, model.routed) for loader in loaders.values()), loaders


def test_unquantized_experts_keep_the_loader_and_take_a_second_load_where_cpu_processing_runs(vllm_config):
    """vLLM's unquantized MoE processing on CPU needs its CPU build's ``_C`` ops from 0.29 on (the
    PyPI wheel has none): run where it can (0.24)."""
    try:
        model = processed_tiny_moe("cpu", quantized=False)
    except AttributeError as exc:  # torch.ops._C.prepack_moe_weight missing in the CUDA wheel
        pytest.skip(f"vLLM's unquantized MoE processing cannot run on CPU here: {exc}")
    assert all(is_the_layers_loader(loader, model.routed) for loader in loaders_of(model).values())
    second = checkpoint(quantized=False, seed=1)
    loaded = model.load_weights(second)  # an RL weight sync: through each parameter's own loader
    assert loaded == {"experts.routed_experts.w13_weight", "experts.routed_experts.w2_weight"} or \
        loaded == {"experts.w13_weight", "experts.w2_weight"}, loaded


def test_moe_weight_loaders_check_is_verified(cpu_nvfp4_kernels):
    with patchkit.applied(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == VERIFIED, verdict.message


@pytest.mark.breaks("vllm.moe_expert_weight_loaders")
def test_moe_weight_loaders_check_fails_when_processing_drops_the_loader(cpu_nvfp4_kernels, monkeypatch):
    """vLLM 0.8.2's behaviour put back: processing ends with a fresh ``Parameter`` for ``w13_weight``.

    Done in the processing loop the check drives (vLLM's quant-method loop), not on vLLM's MoE
    method, which the doctor run's own patches wrap.
    """
    from patchkit.patches.vllm import _nvfp4_checkpoint

    original = _nvfp4_checkpoint.process_weights_after_loading

    def dropping_the_loader(model):
        original(model)
        for module in model.modules():
            if isinstance(getattr(module, "w13_weight", None), torch.nn.Parameter):
                module.w13_weight = torch.nn.Parameter(module.w13_weight.data, requires_grad=False)

    monkeypatch.setattr(_nvfp4_checkpoint, "process_weights_after_loading", dropping_the_loader)
    with patchkit.applied(PATCH):
        (verdict,) = run([PATCH], device="cpu")[0]
    assert verdict.verdict == FAILED
    assert "each with the routed layer's weight_loader: expected all of them, found without it: " \
        "['w13_weight']" in verdict.message, verdict.message
