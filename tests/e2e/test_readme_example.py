"""The README's colocated trainer-to-vLLM example, extracted from README.md and run as written.

The vLLM model is what that example assumes: started for the exported quantization config (vLLM's
``ModelOptNvFp4Config.from_config`` of ``export_qat_config(...)["hf_quant_config"]``, so
``W4A16_NVFP4`` layers) with ``load_format="dummy"``. W4A16 layers use Marlin, CUDA-only in vLLM;
``cpu_marlin_layout`` (tests/vllm/vllm_cpu_harness.py) lets vLLM build and process them on CPU with a
stand-in for Marlin's repack, so no forward runs here. What is checked: the example runs, every
kernel tensor afterwards equals vLLM's own first load of the same exported tensors bit for bit (so
the refit is vLLM's load, whatever the kernel format), and addresses are kept over alternating
refits. The numerical proof (dequantized kernel weight == trained weight, outputs) is in
``test_trainer_to_vllm.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from nvfp4_helpers import bits, dummy_started, process_weights_after_loading
from patchkit.patches.modelopt.qat import export_qat_config, export_qat_weights
from serving import ServingModel
from trainer import trained_state

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- e2e-example: run by tests/e2e/test_readme_example.py -->"


def readme_example() -> str:
    text = README.read_text()
    match = re.search(re.escape(MARKER) + r"\s*```python\n(.*?)```", text, re.S)
    assert match, f"{MARKER} followed by a python block not found in README.md"
    return match.group(1)


def test_readme_example_is_the_documented_one_call():
    code = readme_example()
    assert "refit.refit_weights(vllm_model, export_qat_weights(model_chunks, bridge))" in code


def test_readme_example_runs_and_refits_a_dummy_started_w4a16_model(
        nvfp4_refit_patch, cpu_marlin_layout, cpu_backend, stack):
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    # Marlin takes bf16/fp16 activations only: a bf16 trainer and engine.
    states = [trained_state(False, torch.bfloat16, steps=1), trained_state(False, torch.bfloat16, steps=2)]
    config = export_qat_config([states[0].model])
    assert config["hf_quant_config"]["quantization"]["quant_algo"] == "W4A16_NVFP4"

    def engine_model() -> ServingModel:
        quant_config = ModelOptNvFp4Config.from_config(config["hf_quant_config"])
        shapes = {n: (t.shape, t.dtype) for n, t in export_qat_weights([states[0].model])}
        return ServingModel(shapes, quant_config, torch.bfloat16)

    vllm_model = dummy_started(engine_model(), stack)
    assert vllm_model.linears and all(
        type(vllm_model.get_submodule(n).quant_method).__name__ == "ModelOptNvFp4W4A16LinearMethod"
        for n in vllm_model.linears)
    pointers = {n: t.data_ptr() for n, t in vllm_model.named_parameters()}
    dummy = {n: t.detach().clone() for n, t in vllm_model.named_parameters()}
    code = compile(readme_example(), str(README), "exec")
    for step in range(4):
        state = states[step % 2]
        exec(code, {"vllm_model": vllm_model, "model_chunks": [state.model], "bridge": None})  # noqa: S102
        first_load = engine_model()  # vLLM's own first load of the same tensors
        first_load.load_weights(export_qat_weights([state.model]))
        process_weights_after_loading(first_load)
        expected = dict(first_load.named_parameters())
        got = dict(vllm_model.named_parameters())
        assert got.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(bits(got[name]), bits(tensor)), (step, name)
        assert {n: t.data_ptr() for n, t in vllm_model.named_parameters()} == pointers
        assert not all(torch.equal(bits(dummy[n]), bits(t)) for n, t in expected.items())  # not vacuous
