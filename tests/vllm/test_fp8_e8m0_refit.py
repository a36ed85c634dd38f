"""Block-FP8 layers with power-of-two (E8M0) scales, refitted through patchkit on real vLLM.

vLLM ends up with E8M0 block scales two ways, both on ``Fp8LinearMethod``/``Fp8MoEMethod`` layers (the
``vllm.fp8_refit`` row of the format table):

- DeepGEMM's UE8M0 path (``is_deep_gemm_e8m0_used()``: DeepGEMM on a Hopper or Blackwell GPU, with
  ``VLLM_USE_DEEP_GEMM_E8M0`` at its default): processing requantises every 128 x 128 block of a float32-scaled
  checkpoint at a power-of-two scale (``requant_weight_ue8m0_inplace``) and hands the scales to DeepGEMM's
  layout (``deepgemm_post_process_fp8_weight_block``), for the linear kernel and the DEEPGEMM MoE backend;
- E8M0 checkpoint scales (``is_scale_e8m0``, set by vLLM's DeepSeek-V4 config for its FP4-expert checkpoints
  and by Bailing-MoE): ``weight_scale_inv`` is registered as ``float8_e8m0fnu``.

On CPU the harness forces vLLM's two DeepGEMM decision functions and stands in for DeepGEMM's compiled layout
transform (``vllm_cpu_harness.cpu_deep_gemm_e8m0``); the requantisation is vLLM's. The proof is vLLM's own
first load of the same checkpoint into a fresh model: after each refit every kernel tensor equals its bytes,
at the address it had. Checkpoints are random FP8 with float32 scales, or bf16 weights quantised with
NeMo-RL's power-of-two rule (``fp8_helpers.quantised_from_bf16``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from fp8_helpers import (
    Fp8Linears,
    Fp8Moe,
    bf16_model,
    deep_gemm_ue8m0,
    linear_checkpoint,
    moe_checkpoint,
    quantised_from_bf16,
    with_e8m0_scales,
)
from nvfp4_helpers import (
    assert_same_as_first_load,
    assert_same_kernel_state,
    dummy_started,
    kernel_state,
    process_weights_after_loading,
)
from patchkit.patches.vllm.refit import RefitError, refit_weights
from refit_driver import pointers, refit_alternately

Checkpoint = dict[str, torch.Tensor]


class Case:
    """One way to E8M0 scales: the layer, its checkpoints, and the CPU set-up vLLM's path needs."""

    def __init__(self, kind: str, e8m0_checkpoint: bool, deep_gemm: bool, packed: bool = False) -> None:
        self.kind, self.e8m0_checkpoint, self.deep_gemm, self.packed = kind, e8m0_checkpoint, deep_gemm, packed

    def model(self) -> torch.nn.Module:
        with bf16_model():
            return Fp8Moe(True) if self.kind == "moe" else Fp8Linears(True, e8m0_scales=self.e8m0_checkpoint)

    def checkpoint(self, source: str, seed: int) -> Checkpoint:
        checkpoint = moe_checkpoint(True, seed) if self.kind == "moe" else linear_checkpoint(True, seed)
        if source == "bf16-quantised":
            checkpoint = quantised_from_bf16(checkpoint, seed)
        return with_e8m0_scales(checkpoint) if self.e8m0_checkpoint else checkpoint

    def environment(self) -> contextlib.AbstractContextManager[None]:
        return deep_gemm_ue8m0(self.packed) if self.deep_gemm else contextlib.nullcontext()


CASES = {
    "linear-ue8m0-requant": Case("linear", e8m0_checkpoint=False, deep_gemm=True),
    "linear-ue8m0-packed": Case("linear", e8m0_checkpoint=False, deep_gemm=True, packed=True),
    "moe-ue8m0-requant": Case("moe", e8m0_checkpoint=False, deep_gemm=True),
    "moe-ue8m0-packed": Case("moe", e8m0_checkpoint=False, deep_gemm=True, packed=True),
    "linear-e8m0-checkpoint": Case("linear", e8m0_checkpoint=True, deep_gemm=False),
    "linear-e8m0-checkpoint-deepgemm": Case("linear", e8m0_checkpoint=True, deep_gemm=True),
}
E8M0_CHECKPOINT_CASES = [name for name, case in CASES.items() if case.e8m0_checkpoint]


def first_load(case: Case, checkpoint: Checkpoint) -> torch.nn.Module:
    """vLLM's own first load: a fresh model, its loaders, its processing."""
    model = case.model()
    model.load_weights(iter(list(checkpoint.items())))
    process_weights_after_loading(model)
    return model


def started(case: Case, start: str, vllm_config: object) -> torch.nn.Module:
    if start == "dummy":
        return dummy_started(case.model(), vllm_config)
    return first_load(case, case.checkpoint("fp8", seed=100))


def assert_power_of_two_scales(case: Case, model: torch.nn.Module) -> None:
    """vLLM's E8M0 path was taken: every block scale the layer serves is a power of two (E8M0 bytes, the
    packed layout's int32 words of them, or float32 values with no mantissa)."""
    scales = {name: t for name, t in model.named_parameters() if name.endswith("weight_scale_inv")}
    assert scales
    for name, scale in scales.items():
        if case.packed:
            assert scale.dtype == torch.int32, name
        elif scale.dtype == torch.float8_e8m0fnu:
            assert case.e8m0_checkpoint and not case.deep_gemm, name
        else:
            mantissa, _ = torch.frexp(scale.detach().float())
            assert scale.dtype == torch.float32 and bool((mantissa == 0.5).all()), name


@pytest.mark.parametrize("source", ["fp8", "bf16-quantised"])
@pytest.mark.parametrize("start", ["load", "dummy"])
@pytest.mark.parametrize("name", list(CASES))
def test_refits_with_e8m0_scales_equal_vllms_first_load_in_the_same_kernel_tensors(
    fp8_refit_patch: None, vllm_config: object, name: str, start: str, source: str
) -> None:
    case = CASES[name]
    with case.environment():
        model = started(case, start, vllm_config)
        assert_power_of_two_scales(case, model)
        checkpoints = [case.checkpoint(source, seed) for seed in (1, 2)]
        refit_alternately(model, checkpoints, 4,
                          lambda checkpoint: assert_same_as_first_load(model, first_load(case, checkpoint)),
                          pointers)
        assert_power_of_two_scales(case, model)


@pytest.mark.parametrize("name", ["moe-ue8m0-packed", "linear-ue8m0-packed"])
def test_a_refit_loads_the_checkpoint_layout_where_vllm_serves_another(
    fp8_refit_patch: None, vllm_config: object, name: str
) -> None:
    """The served scales have DeepGEMM's shape and dtype, not the checkpoint's (which is why NeMo-RL resets its
    routed experts to the checkpoint layout before each reload); a refit loads into parameters of the
    checkpoint's layout, as ``create_weights`` registered them, and serves vLLM's processing of them."""
    case = CASES[name]
    with case.environment():
        model = started(case, "load", vllm_config)
        checkpoint = case.checkpoint("bf16-quantised", seed=1)
        sent = {t.dtype for n, t in checkpoint.items() if n.endswith("weight_scale_inv")}
        served = {t.dtype for n, t in model.named_parameters() if n.endswith("weight_scale_inv")}
        assert (sent, served) == ({torch.float32}, {torch.int32})
        refit_weights(model, iter(list(checkpoint.items())))
        assert_same_as_first_load(model, first_load(case, checkpoint))


def _float_scales(checkpoint: Checkpoint) -> str:
    """The last E8M0 scale sent as float32 (its values, not E8M0's)."""
    name = next(n for n in reversed(checkpoint) if n.endswith("weight_scale_inv"))
    checkpoint[name] = checkpoint[name].float() * 1.4  # 0.7 of the next power of two: copy_ would round it
    return name


def _nan_scale(checkpoint: Checkpoint) -> str:
    """One E8M0 NaN byte (0xFF) in the last scale."""
    name = next(n for n in reversed(checkpoint) if n.endswith("weight_scale_inv"))
    data = checkpoint[name].view(torch.uint8).clone()
    data.reshape(-1)[0] = 0xFF
    checkpoint[name] = data.view(torch.float8_e8m0fnu)
    return name


@pytest.mark.parametrize("spoil", [_float_scales, _nan_scale], ids=["float32-scale", "nan-scale"])
@pytest.mark.parametrize("start", ["load", "dummy"])
@pytest.mark.parametrize("name", E8M0_CHECKPOINT_CASES)
def test_a_bad_e8m0_scale_is_refused_and_changes_nothing(
    fp8_refit_patch: None, vllm_config: object, name: str, start: str,
    spoil: Callable[[Checkpoint], str],
) -> None:
    """vLLM's loader casts a float32 scale into the E8M0 parameter (rounding it to a power of two) and takes
    E8M0's NaN byte (served as NaN, or as +inf once upcast for DeepGEMM); a refit refuses both, naming the
    parameter, before anything changes."""
    case = CASES[name]
    with case.environment():
        model = started(case, start, vllm_config)
        before = kernel_state(model)
        bad = case.checkpoint("fp8", seed=3)
        spoiled = spoil(bad)
        with pytest.raises(RefitError) as caught:
            refit_weights(model, iter(list(bad.items())))
        assert caught.value.parameter == "weight_scale_inv", caught.value
        assert spoiled.partition(".")[0] in str(caught.value)
        assert_same_kernel_state(model, before)
        good = case.checkpoint("fp8", seed=4)
        refit_weights(model, iter(list(good.items())))
        assert_same_as_first_load(model, first_load(case, good))
