"""The QAT export's expert layouts through vLLM's own ``Qwen3MoeForCausalLM.load_weights``.

What verl and NeMo-RL call: ``model.load_weights(stream)`` on vLLM's model. The export is the
recorded ``export_qat_weights`` stream of a tiny Qwen3-MoE (``qwen3_moe_serving`` says how and why
it is recorded); the model is vLLM's own class, built from the export's config and loaded and
processed as vLLM's loader does. Environments ``vllm-0.24``, ``vllm-0.29``, ``vllm-0.33``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from nvfp4_helpers import assert_same_kernel_state, kernel_state
from qwen3_moe_serving import (
    bits,
    differing,
    expert_parallel_group,
    load,
    new_model,
    no_amx_gemm,
    stream,
    trained,
    with_input_scales,
)


@pytest.fixture(scope="module")
def qwen3_moe(vllm_config: object, cpu_nvfp4_kernels: None,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A folder for the recorded Qwen3-MoE's config, with vLLM's expert-parallel group in place."""
    with expert_parallel_group(), no_amx_gemm():
        yield tmp_path_factory.mktemp("qwen3-moe")


def test_per_expert_stream_loads_through_vllms_load_weights_and_serves_the_trained_weights(qwen3_moe):
    model, config = new_model(qwen3_moe)
    reference = trained()
    loaded = load(model, config, with_input_scales(stream("per_expert")))
    assert differing(model, reference) == []
    assert {n for n in loaded if ".experts." in n}, loaded


def _expert_names(names: set[str]) -> set[str]:
    return {name for name in names if ".experts." in name}


def test_vllms_load_weights_skips_the_fused_expert_names_without_a_word(qwen3_moe):
    """vLLM's fact, on every release here: ``experts.w13_*``/``w2_*`` match no entry of the model's expert
    mapping, and nothing refuses them (0.24: ``Qwen3MoeModel.load_weights`` skips a name that is not a
    parameter; 0.29+: ``RoutedExperts.load_weights`` skips a name no mapping entry matches). The experts
    keep whatever they held: here, the unloaded parameters of a fresh model."""
    model, config = new_model(qwen3_moe)
    loaded = load(model, config, with_input_scales(stream("fused")))  # no error
    assert _expert_names(loaded) == set()
    wrong = differing(model, trained())
    experts = {name for name in trained() if ".mlp.experts." in name}
    assert set(wrong) == experts  # every expert projection, and nothing else


def test_the_fused_stream_split_per_expert_loads_through_load_weights_bit_for_bit(qwen3_moe):
    """``split_fused_experts``: the way from a fused stream (patchkit's or Bridge 0.6's own export) to vLLM."""
    from patchkit.patches.modelopt.qat import split_fused_experts

    model, config = new_model(qwen3_moe)
    loaded = load(model, config, with_input_scales(split_fused_experts(stream("fused"))))
    assert differing(model, trained()) == []
    assert _expert_names(loaded)



def test_the_split_fused_stream_is_the_per_expert_stream_byte_for_byte() -> None:
    from patchkit.patches.modelopt.qat import split_fused_experts

    per_expert = stream("per_expert")
    split = list(split_fused_experts(stream("fused")))
    assert sorted(name for name, _ in split) == sorted(name for name, _ in per_expert)
    wanted = dict(per_expert)
    for name, tensor in split:
        assert tensor.dtype == wanted[name].dtype and tensor.shape == wanted[name].shape, name
        assert torch.equal(bits(tensor), bits(wanted[name])), name


# --- patchkit's refit: the fused names are refused, loudly, and nothing changes ------------------


@pytest.fixture
def refitted(qwen3_moe, nvfp4_refit_patch: None) -> tuple[torch.nn.Module, object]:
    """A model started from the per-expert stream, then refitted with it once (the refit patch applied)."""
    from patchkit.patches.vllm.refit import refit_weights

    model, config = new_model(qwen3_moe)
    load(model, config, with_input_scales(stream("per_expert")))
    refit_weights(model, with_input_scales(stream("per_expert")))
    assert differing(model, trained()) == []
    return model, config


def test_refit_weights_refuses_the_fused_stream_and_keeps_serving_the_previous_weights(refitted) -> None:
    from patchkit.patches.vllm.refit import RefitError, refit_weights

    model, _ = refitted
    before = kernel_state(model)
    with pytest.raises(RefitError) as caught:
        refit_weights(model, with_input_scales(stream("fused")))
    assert "experts" in str(caught.value), str(caught.value)
    assert_same_kernel_state(model, before)
    assert differing(model, trained()) == []


def test_refit_weights_takes_the_fused_stream_split_per_expert(refitted) -> None:
    from patchkit.patches.modelopt.qat import split_fused_experts
    from patchkit.patches.vllm.refit import refit_weights

    model, _ = refitted
    pointers = {name: tensor.data_ptr() for name, tensor in model.named_parameters()}
    refit_weights(model, with_input_scales(split_fused_experts(stream("fused"))))
    assert differing(model, trained()) == []
    assert {name: tensor.data_ptr() for name, tensor in model.named_parameters()} == pointers
