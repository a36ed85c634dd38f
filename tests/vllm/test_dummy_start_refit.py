"""Refit after a ``load_format="dummy"`` start, as verl and NeMo-RL run vLLM (real vLLM, CPU).

The layers are built by vLLM's own ``create_weights`` (linear and fused MoE) and never loaded:
vLLM's ``DummyModelLoader`` fills them with random values and processing converts those, so no
weight went through a loader before the first refit. What a refit must supply then comes from the
layers' own parameters. Checked here: a refit equals a normal load of the same tensors, bit for
bit, in kernel tensors and outputs; and bad input is refused by name with every layer keeping what
it served (the dummy weights) — no layer half-refitted.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from moe_helpers import WEIGHTS_A as MOE_A
from moe_helpers import WEIGHTS_B as MOE_B
from moe_helpers import MoEModel
from moe_helpers import assert_serves as moe_assert_serves
from moe_helpers import loaded_model as moe_loaded_model
from nvfp4_helpers import (
    DOWN,
    UP,
    TwoLinears,
    assert_same_kernel_state,
    assert_serves,
    bits,
    dummy_started,
    exact_activations,
    items,
    kernel_state,
    loaded_model,
    weights_a,
    weights_b,
)
from patchkit.patches.vllm.refit import RefitError, finish_refit, prepare_refit, refit, refit_weights

# --- linear ----------------------------------------------------------------------------------------


def test_dummy_start_refit_equals_a_normal_load(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = dummy_started(TwoLinears(), vllm_config)
    pointers = {name: t.data_ptr() for name, t in model.named_parameters()}
    for step in range(10):  # ten refits alternating two checkpoints
        weights = weights_a() if step % 2 == 0 else weights_b()
        refit_weights(model, items(weights))
        reference = loaded_model(weights)  # vLLM's own first load of the same tensors
        for layer, in_features in ((UP, 64), (DOWN, 32)):
            x = exact_activations(5, in_features, seed=step)
            assert torch.equal(getattr(model, layer)(x)[0], getattr(reference, layer)(x)[0])
        for name, tensor in reference.named_parameters():
            assert torch.equal(bits(dict(model.named_parameters())[name]), bits(tensor)), name
        assert_serves(model, weights)
        assert {name: t.data_ptr() for name, t in model.named_parameters()} == pointers


def test_dummy_start_context_manager_form_works_too(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = dummy_started(TwoLinears(), vllm_config)
    with refit(model):
        model.load_weights(items(weights_a()))
    assert_serves(model, weights_a())


def bad_dummy_refit(
    corrupt: Callable[[dict[str, torch.Tensor]], None], vllm_config: object, *, one_call: bool = True
) -> RefitError:
    model = dummy_started(TwoLinears(), vllm_config)
    before = kernel_state(model)
    weights = weights_a()
    corrupt(weights)
    with pytest.raises(RefitError) as caught:
        if one_call:
            refit_weights(model, items(weights))
        else:
            with refit(model):
                model.load_weights(items(weights))
    assert_same_kernel_state(model, before)  # both layers keep the dummy weights, same storage
    refit_weights(model, items(weights_b()))  # and a good refit still works
    assert_serves(model, weights_b())
    return caught.value


@pytest.mark.parametrize("one_call", [True, False], ids=["refit_weights", "context_manager"])
def test_dummy_start_missing_parameter_is_refused(nvfp4_refit_patch: None, vllm_config: object, one_call: bool) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        del weights[f"{DOWN}.weight_scale_2"]

    error = bad_dummy_refit(corrupt, vllm_config, one_call=one_call)
    assert (error.layer, error.parameter, error.got) == (DOWN, "weight_scale_2", "missing")
    assert "'down'" in str(error) and "'weight_scale_2'" in str(error)


def test_dummy_start_every_missing_parameter_is_refused(nvfp4_refit_patch: None, vllm_config: object) -> None:
    for name in weights_a():
        layer, _, parameter = name.partition(".")

        def corrupt(weights: dict[str, torch.Tensor], name: str = name) -> None:
            del weights[name]

        error = bad_dummy_refit(corrupt, vllm_config)
        assert (error.layer, error.parameter) == (layer, parameter)


def test_dummy_start_wrong_shape_is_refused(nvfp4_refit_patch: None, vllm_config: object) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        weights[f"{UP}.weight"] = weights[f"{UP}.weight"][:16].contiguous()

    error = bad_dummy_refit(corrupt, vllm_config)
    assert (error.layer, error.parameter) == (UP, "weight")
    assert error.expected == "(32, 32) torch.uint8" and error.got == "(16, 32) torch.uint8"


def test_dummy_start_wrong_dtype_is_refused(nvfp4_refit_patch: None, vllm_config: object) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        weights[f"{DOWN}.weight"] = weights[f"{DOWN}.weight"].to(torch.int32)

    error = bad_dummy_refit(corrupt, vllm_config)
    assert (error.layer, error.parameter) == (DOWN, "weight")
    assert "torch.int32" in str(error) and "torch.uint8" in str(error)


def test_dummy_start_unknown_name_is_refused_by_name(nvfp4_refit_patch: None, vllm_config: object) -> None:
    def corrupt(weights: dict[str, torch.Tensor]) -> None:
        weights["up.not_a_parameter"] = torch.zeros(1)

    error = bad_dummy_refit(corrupt, vllm_config)
    assert (error.layer, error.parameter) == (UP, "not_a_parameter")
    assert "'up.not_a_parameter'" in str(error)


def test_dummy_start_refit_without_the_patch_says_why(cpu_nvfp4_kernels: None, vllm_config: object) -> None:
    model = dummy_started(TwoLinears(), vllm_config)
    with pytest.raises(RefitError, match="vllm.nvfp4_refit"):
        refit_weights(model, items(weights_a()))


# --- fused MoE -------------------------------------------------------------------------------------


def test_dummy_start_moe_refit_equals_a_normal_load(nvfp4_refit_patch: None, vllm_config: object) -> None:
    model = dummy_started(MoEModel(), vllm_config)
    pointers = {name: t.data_ptr() for name, t in model.routed.named_parameters()}
    for weights in (MOE_A, MOE_B, MOE_A):
        refit_weights(model, items(weights))
        moe_assert_serves(model, weights)
        reference = moe_loaded_model(weights)
        for name, tensor in reference.routed.named_parameters():
            got = dict(model.routed.named_parameters())[name]
            assert torch.equal(bits(got), bits(tensor)), name
        assert {name: t.data_ptr() for name, t in model.routed.named_parameters()} == pointers


@pytest.mark.parametrize(
    ("missing", "parameter"),
    [
        ("experts.3.down_proj.weight_scale", "w2_weight_scale"),
        ("experts.0.up_proj.weight", "w13_weight"),
        ("experts.1.gate_proj.weight_scale_2", "w13_weight_scale_2"),
        ("experts.2.up_proj.input_scale", "w13_input_scale"),
    ],
)
def test_dummy_start_moe_missing_expert_tensor_is_refused(
    nvfp4_refit_patch: None, vllm_config: object, missing: str, parameter: str
) -> None:
    model = dummy_started(MoEModel(), vllm_config)
    before = kernel_state(model)
    weights = {k: v for k, v in MOE_A.items() if k != missing}
    with pytest.raises(RefitError) as caught:
        refit_weights(model, items(weights))
    assert (caught.value.layer, caught.value.parameter) == ("experts.routed_experts", parameter)
    assert_same_kernel_state(model, before)


def test_moe_input_scales_of_gate_and_up_land_in_their_own_slots(nvfp4_refit_patch: None, vllm_config: object) -> None:
    """NeMo-RL (#2983 review): ``FusedMoE.weight_loader``'s ``input_scale`` branch wrote a scalar over
    the whole ``[expert]`` row of ``w13_input_scale``, so ``up_proj`` overwrote ``gate_proj``. Read
    what the loader wrote, before processing reduces the two slots to one."""
    model = dummy_started(MoEModel(), vllm_config)
    weights = dict(MOE_A)
    for expert in range(4):
        weights[f"experts.{expert}.gate_proj.input_scale"] = torch.tensor(2.0 + expert)
        weights[f"experts.{expert}.up_proj.input_scale"] = torch.tensor(0.5)
    prepare_refit(model)
    model.load_weights(items(weights))
    staged = model.routed.w13_input_scale
    assert staged.tolist() == [[2.0 + e, 0.5] for e in range(4)]
    finish_refit(model)
    # EMULATION keeps 1 / max over gate and up, per layer: the gate scale (up to 5.0) must win.
    assert torch.equal(model.routed.w13_input_scale, 1.0 / torch.tensor(5.0))
