"""What vLLM serves is what the trainer trained: export -> refit in one process, CPU.

Trainer: tiny QAT Megatron GPTs (dense and MoE) after real SGD steps (``trainer.py``). Serving:
vLLM's own ModelOpt NVFP4 layers, built by vLLM's ``create_weights``, started as
``load_format="dummy"`` does (vLLM's ``DummyModelLoader``, then processing), never loaded from a
checkpoint, then filled only by patchkit's ``refit_weights`` from ``export_qat_weights`` streaming
in the same process (``serving.py``).

Which vLLM layer, and what "the same" means (see docs/qat-export.md "Trainer to vLLM"):

- The export is W4A16 (``quant_algo`` ``W4A16_NVFP4``). vLLM 0.29 serves W4A16 NVFP4 only with
  Marlin, which is CUDA-only. Its CPU NVFP4 kernel is the emulation kernel of the W4A4 method
  (``ModelOptNvFp4LinearMethod``), which quantizes activations too. So the layers here are W4A4
  layers and the stream gets an ``input_scale`` of 1.0 per linear (``with_input_scales``); the weight
  path (checkpoint tensors -> vLLM's loaders -> processing -> the kernel's dequantization) is the
  one under test.
- Weights: the weight vLLM's kernel multiplies (vLLM's own ``dequantize_to_dtype`` on the processed
  kernel tensors) equals the trainer's fake-quantized weight (``weight_quantizer(weight)``) **bit for
  bit**, for every linear and every expert of every MoE layer.
- Outputs, linear layers: on activations that NVFP4 activation quantization leaves unchanged (E2M1
  values, a 6.0 in every block of 16, global scale 1), vLLM's W4A4 emulation output equals the
  trainer's W4A16 QAT layer output within the float32 matmul bound ``2·K·2⁻²⁴·(|x|·|W|ᵀ)``: the
  two sides multiply the same operands through different calls (``torch.matmul`` vs Megatron's
  linear), which may sum in different orders. On random activations vLLM's output equals the
  trainer's layer applied to vLLM's quantize-dequantize of the activations, within the same bound;
  the remaining difference to the trainer's W4A16 output is activation quantization, which Marlin
  (W4A16) does not do. Fused MoE: vLLM's NVFP4 MoE forward is Triton-only, so experts are checked
  by their dequantized kernel weights only.
"""

from __future__ import annotations

import pytest
import torch
from nvfp4_helpers import assert_same_kernel_state, bits, dummy_started, kernel_state
from patchkit.patches.modelopt.qat import QATExportError, export_qat_weights
from patchkit.patches.vllm.refit import RefitError, refit_weights
from serving import ServingModel, served_expert_weights, served_linear_weight, with_input_scales
from trainer import INPUT_SCALE, TrainedState, trained_state

CASES = [
    pytest.param(False, torch.float32, id="dense-fp32"),
    pytest.param(True, torch.float32, id="moe-fp32"),
    pytest.param(False, torch.bfloat16, id="dense-bf16"),
    pytest.param(True, torch.bfloat16, id="moe-bf16"),
]


def shapes_of(state: TrainedState) -> dict[str, tuple[torch.Size, torch.dtype]]:
    return {name: (tensor.shape, tensor.dtype) for name, tensor in export_qat_weights([state.model])}


def matmul_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Largest difference two summation orders of ``x @ w.T`` can have: 2·γ_K with float32
    accumulation (u = 2⁻²⁴, K·u ≪ 1), plus one rounding of each result to bfloat16 (2·2⁻⁹) when
    the output is bfloat16."""
    k = x.shape[-1]
    magnitude = x.abs().double() @ w.abs().double().T
    rounding = 2 * 2.0**-9 if x.dtype == torch.bfloat16 else 0.0
    return (2 * k * 2.0**-24 + rounding) * magnitude


def assert_within_matmul_bound(got: torch.Tensor, want: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    diff = (got.double() - want.double()).abs()
    assert bool((diff <= matmul_bound(x, w)).all()), float(diff.max())
    return float(diff.max())


def assert_serves(model: ServingModel, state: TrainedState) -> dict[str, float]:
    """The checks in the module docstring; returns the largest differences seen (for the report)."""
    figures = {"w4a16_out": 0.0, "a4_vs_w4a16": 0.0}
    checked = 0
    for name in model.linears:
        layer = model.get_submodule(name)
        ref = state.linears[name]
        served = served_linear_weight(layer, state.dtype)
        assert torch.equal(bits(served), bits(ref.fake_quant)), name  # bit for bit
        assert ref.x_exact is not None and ref.x_random is not None
        out_exact, _ = layer(ref.x_exact)
        figures["w4a16_out"] = max(figures["w4a16_out"], assert_within_matmul_bound(
            out_exact, ref.out_exact, ref.x_exact, ref.fake_quant))
        out_random, _ = layer(ref.x_random)
        assert_within_matmul_bound(out_random, ref.out_random_a4, ref.x_random, ref.fake_quant)
        figures["a4_vs_w4a16"] = max(figures["a4_vs_w4a16"], float((out_random - ref.out_random).abs().max()))
        checked += 1
    for prefix in model.moe_layers:
        w13, w2 = served_expert_weights(model.get_submodule(prefix), state.dtype)
        for expert in range(w13.shape[0]):
            fc1 = state.linears[f"{prefix}.local_experts.{expert}.linear_fc1"].fake_quant
            fc2 = state.linears[f"{prefix}.local_experts.{expert}.linear_fc2"].fake_quant
            assert torch.equal(bits(w13[expert]), bits(fc1)), (prefix, expert)
            assert torch.equal(bits(w2[expert]), bits(fc2)), (prefix, expert)
            checked += 2
    served_layers = tuple(f"{prefix}." for prefix in model.linears + model.moe_layers)
    plain = {n: p for n, p in model.named_parameters() if not n.startswith(served_layers)}
    for name, param in plain.items():
        assert torch.equal(bits(param), bits(state.model.get_parameter(name))), name
    assert checked >= len(state.linears) and plain
    return figures


def refit_from_trainer(model: ServingModel, state: TrainedState) -> None:
    """Colocated: the export generator streams straight into the refit (one tensor at a time)."""
    refit_weights(model, with_input_scales(export_qat_weights([state.model]), INPUT_SCALE))


@pytest.mark.parametrize(("moe", "dtype"), CASES)
def test_vllm_serves_the_trained_weights_through_ten_refits(nvfp4_refit_patch, cpu_backend, stack, moe, dtype):
    states = [trained_state(moe, dtype, steps=1), trained_state(moe, dtype, steps=2)]
    name = next(iter(states[0].linears))
    assert not torch.equal(states[0].linears[name].fake_quant, states[1].linears[name].fake_quant)
    model = dummy_started(ServingModel(shapes_of(states[0]), "NVFP4", dtype), stack)
    assert (len(model.moe_layers) == 2) == moe and model.linears
    with pytest.raises(AssertionError):  # the dummy start serves something else
        assert_serves(model, states[0])
    pointers = {n: t.data_ptr() for n, t in model.named_parameters()}
    figures = []
    for step in range(10):  # two trained states, alternating
        refit_from_trainer(model, states[step % 2])
        figures.append(assert_serves(model, states[step % 2]))
        assert {n: t.data_ptr() for n, t in model.named_parameters()} == pointers
    # Not vacuous: W4A4 emulation on random activations does differ from the W4A16 layer.
    assert max(f["a4_vs_w4a16"] for f in figures) > 0


@pytest.mark.parametrize(("moe", "missing"), [
    pytest.param(False, "decoder.layers.1.mlp.linear_fc2", id="dense-linear"),
    pytest.param(True, "decoder.layers.1.self_attention.linear_qkv", id="moe-linear"),
    pytest.param(True, "decoder.layers.1.mlp.experts", id="moe-experts"),
])
def test_a_vllm_model_missing_a_name_is_refused_and_no_nvfp4_layer_changes(
        nvfp4_refit_patch, cpu_backend, stack, moe, missing):
    state = trained_state(moe, torch.float32, steps=1)
    model = dummy_started(ServingModel(shapes_of(state), "NVFP4", torch.float32, leave_out=(missing,)), stack)
    before = kernel_state(model)
    with pytest.raises(RefitError) as caught:
        refit_from_trainer(model, state)
    error = caught.value
    assert error.layer is not None and error.layer.startswith(missing), (error.layer, str(error))
    assert error.parameter and f"'{error.layer}.{error.parameter}'" in str(error)
    nvfp4 = {n: v for n, v in before.items() if any(n.startswith(p + ".") for p in model.linears + model.moe_layers)}
    assert nvfp4
    after = kernel_state(model)
    for n, (ptr, data) in nvfp4.items():
        assert after[n][0] == ptr and torch.equal(bits(after[n][1]), bits(data)), n


def test_a_failed_refit_leaves_no_plain_parameter_changed(nvfp4_refit_patch, cpu_backend, stack):
    """Norms, embeddings and the output layer are written in place by vLLM's loaders before the
    failing name; the refit puts them back too (``refit._plain``)."""
    state = trained_state(False, torch.float32, steps=1)
    model = dummy_started(ServingModel(shapes_of(state), "NVFP4", torch.float32,
                                       leave_out=("decoder.layers.1.mlp.linear_fc2",)), stack)
    before = kernel_state(model)
    streamed = []

    def recording(weights):
        for name, tensor in weights:
            streamed.append(name)
            yield name, tensor

    with pytest.raises(RefitError):
        refit_weights(model, recording(with_input_scales(export_qat_weights([state.model]), INPUT_SCALE)))
    served = tuple(f"{prefix}." for prefix in model.linears + model.moe_layers)
    plain_written = [n for n in streamed[:-1] if not n.startswith(served)]
    assert plain_written, streamed  # not vacuous: plain parameters were written before the failure
    assert_same_kernel_state(model, before)


def test_after_a_failed_refit_the_model_serves_the_previous_refit_exactly(nvfp4_refit_patch, cpu_backend, stack):
    states = [trained_state(False, torch.float32, steps=1), trained_state(False, torch.float32, steps=2)]
    model = dummy_started(ServingModel(shapes_of(states[0]), "NVFP4", torch.float32,
                                       leave_out=("decoder.layers.1.mlp.linear_fc2",)), stack)
    good = [(n, t) for n, t in with_input_scales(export_qat_weights([states[0].model]), INPUT_SCALE)
            if not n.startswith("decoder.layers.1.mlp.linear_fc2.")]
    refit_weights(model, iter(good))
    after_first = kernel_state(model)
    with pytest.raises(RefitError):
        refit_from_trainer(model, states[1])  # the left-out layer's names fail near the end
    assert_same_kernel_state(model, after_first)
    refit_weights(model, iter(good))  # and the model still refits
    assert_same_kernel_state(model, after_first)


def test_a_diverged_step_is_refused_and_the_model_serves_the_previous_refit(nvfp4_refit_patch, cpu_backend, stack):
    """A NaN weight in the trainer: the export's check is read at the end of the stream, so vLLM's
    loaders have taken every tensor; the exporter's own error reaches the caller (not a RefitError
    about the last tensor) and the refit rolls back."""
    states = [trained_state(False, torch.float32, steps=1), trained_state(False, torch.float32, steps=2)]
    model = dummy_started(ServingModel(shapes_of(states[0]), "NVFP4", torch.float32), stack)
    refit_from_trainer(model, states[0])
    before = kernel_state(model)
    name = next(iter(states[1].linears))
    with torch.no_grad():
        states[1].model.get_parameter(f"{name}.weight")[0, 0] = float("nan")
    with pytest.raises(QATExportError, match="NaN or infinite") as caught:
        refit_from_trainer(model, states[1])
    assert caught.value.parameter == f"{name}.weight"
    assert_same_kernel_state(model, before)
    assert_serves(model, states[0])
