"""A tiny Qwen3-MoE served by vLLM's own ``Qwen3MoeForCausalLM``, fed the export's expert layouts.

Run as a script in a fresh interpreter (``test_moe_export_load_weights`` does): vLLM creates its
expert-parallel group only when the model it is initialised for is an MoE, and the session's
harness (``cpu_harness.vllm_cpu_config``) is initialised for a dense Llama. Here vLLM's parallel
state is set up for this Qwen3-MoE config, as ``vllm_cpu_config`` does for its own (gloo, world
size 1), with the harness's NVFP4 emulation kernels for CPU.

The trainer side: high-precision expert weights under their Hugging Face names (what
Megatron-Bridge's ``export_hf_weights`` streams for a Qwen3-MoE: one amax per Megatron
``linear_fc1``, shared by an expert's gate and up projections, and one per ``linear_fc2``), turned
into checkpoint tensors by the export's own code (``_export_tensors.checkpoint_tensors`` for
``per_expert``, ``_fused_experts.fuse_experts`` for ``fused``: what ``export_qat_weights`` runs for
either layout; ``tests/export`` shows its two streams hold the same bytes). What the trainer's QAT
forward multiplies is the NVFP4 quantize-dequantize of those weights with the same global scale,
computed here with vLLM's reference (``ref_nvfp4_quant_dequant``), independently of the packing.

The serving side is vLLM's model, loaded only through its own ``model.load_weights`` (or
patchkit's ``refit_weights``, which calls it), then ``process_weights_after_loading``; what its MoE
kernel multiplies is read back with vLLM's ``dequantize_to_dtype`` (the MoE forward is Triton-only).
Prints one JSON line of findings.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cpu_harness  # noqa: E402

EXPERTS, HIDDEN, INTERMEDIATE, LAYERS = 4, 64, 32, 2
BLOCK = 16
#: vLLM's W4A4 method has the CPU emulation MoE kernel (W4A16 MoE is Marlin, CUDA only): each
#: projection gets an input scale, as tests/e2e gives its W4A4 layers.
INPUT_SCALE = 1.0

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": HIDDEN,
    "intermediate_size": 128, "moe_intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": EXPERTS,
    "num_experts_per_tok": 2, "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "torch_dtype": "float32", "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
}


def trained_experts(seed: int) -> dict[str, torch.Tensor]:
    """Hugging Face name -> float32 weight, for every expert projection of every layer."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(LAYERS):
        for expert in range(EXPERTS):
            prefix = f"model.layers.{layer}.mlp.experts.{expert}"
            scale = 0.02 * (1 + expert + layer)
            for projection, shape in (("gate_proj", (INTERMEDIATE, HIDDEN)), ("up_proj", (INTERMEDIATE, HIDDEN)),
                                      ("down_proj", (HIDDEN, INTERMEDIATE))):
                weights[f"{prefix}.{projection}.weight"] = torch.randn(shape, generator=generator) * scale
    return weights


def amaxes(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-tensor amax as the Megatron linears have it: gate and up share linear_fc1's."""
    result = {}
    for name, weight in weights.items():
        if ".gate_proj." in name or ".up_proj." in name:
            gate, up = weights[name.replace(".up_proj.", ".gate_proj.")], weights[name.replace(".gate_proj.", ".up_proj.")]
            result[name] = torch.maximum(gate.abs().amax(), up.abs().amax())
        else:
            result[name] = weight.abs().amax()
    return result


def export_stream(weights: dict[str, torch.Tensor], layout: str):
    """The checkpoint tensors of ``weights`` in ``layout``, made by the export's own functions."""
    from patchkit.patches.modelopt._export_finite import NonFiniteWeights
    from patchkit.patches.modelopt._export_tensors import QuantSpec, checkpoint_tensors
    from patchkit.patches.modelopt._fused_experts import fuse_experts

    specs = {name: QuantSpec(BLOCK, amax, torch.tensor(INPUT_SCALE * 448 * 6)) for name, amax in amaxes(weights).items()}
    stream = ((name, weight, specs[name]) for name, weight in weights.items())
    nonfinite = NonFiniteWeights()
    emit = functools.partial(checkpoint_tensors, nonfinite=nonfinite)
    if layout == "fused":
        yield from fuse_experts(stream, EXPERTS, emit)
    else:
        for name, weight, spec in stream:
            yield from emit(name, weight, spec)
    nonfinite.raise_if_any()


def trainer_fake_quant(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the trainer's QAT forward multiplies: NVFP4 quantize-dequantize at amax / (6 * 448)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant

    result = {}
    for name, amax in amaxes(weights).items():
        global_scale = (448.0 * 6.0 / amax.float()).reshape(1)
        result[name] = ref_nvfp4_quant_dequant(weights[name], global_scale, BLOCK)
    return result


_HELD: list = []  # the current-config context, kept open (a collected generator would close it)
_models = iter(range(1000))


def new_model(config):
    """A fresh ``Qwen3MoeForCausalLM``; vLLM registers layers by prefix process-wide, so each gets its own."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

    with set_current_vllm_config(config):
        return Qwen3MoeForCausalLM(vllm_config=config, prefix=f"m{next(_models)}")


def build_model(model_dir: Path):
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = VllmConfig(model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32"))
    config.quant_config = ModelOptNvFp4Config("NVFP4", True, None, ["lm_head", "mlp.gate", "self_attn"], BLOCK)
    _HELD.append(set_current_vllm_config(config))
    _HELD[-1].__enter__()  # for the process's life, as a vLLM worker holds it
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{cpu_harness._free_port()}")
    initialize_model_parallel(1, 1)
    return config


def moe_layers(model) -> list:
    """Each decoder layer's routed-experts module (the one holding w13_weight)."""
    layers = []
    for layer in model.model.layers:
        experts = layer.mlp.experts
        layers.append(getattr(experts, "routed_experts", experts))
    return layers


def served_mismatches(model, reference: dict[str, torch.Tensor]) -> list[str]:
    """Names of the expert projections whose served (kernel, dequantized) weight differs from ``reference``."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype

    wrong = []
    for index, layer in enumerate(moe_layers(model)):
        w13 = dequantize_to_dtype(layer.w13_weight.data, layer.w13_weight_scale.data,
                                  layer.w13_weight_scale_2.reshape(-1), torch.float32, BLOCK, swizzle=False)
        w2 = dequantize_to_dtype(layer.w2_weight.data, layer.w2_weight_scale.data,
                                 layer.w2_weight_scale_2.reshape(-1), torch.float32, BLOCK, swizzle=False)
        for expert in range(EXPERTS):
            prefix = f"model.layers.{index}.mlp.experts.{expert}"
            gate_up = torch.cat([reference[f"{prefix}.gate_proj.weight"], reference[f"{prefix}.up_proj.weight"]])
            if not torch.equal(w13[expert], gate_up):
                wrong.append(f"{prefix}.gate_up")
            if not torch.equal(w2[expert], reference[f"{prefix}.down_proj.weight"]):
                wrong.append(f"{prefix}.down_proj")
    return wrong


def main() -> None:
    from nvfp4_helpers import dummy_started, process_weights_after_loading

    import patchkit

    cpu_harness.select_cpu_platform()
    findings: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as folder, cpu_harness.cpu_nvfp4_kernels():
        config = build_model(Path(folder))
        steps = [trained_experts(seed) for seed in (1, 2)]
        references = [trainer_fake_quant(weights) for weights in steps]
        findings["reference_differs_between_steps"] = not all(
            torch.equal(references[0][n], references[1][n]) for n in references[0])

        for layout in ("per_expert", "fused"):
            model = new_model(config)
            stream = list(export_stream(steps[0], layout))
            loaded = model.load_weights(iter(stream))
            process_weights_after_loading(model)
            findings[layout] = {
                "names": len(stream),
                "expert_parameters_loaded": sorted(n for n in (loaded or ()) if ".experts." in n),
                "mismatches": served_mismatches(model, references[0]),
            }

        # patchkit's refit on the same model class: dummy start, then two trained steps in turn.
        with patchkit.applied("vllm.nvfp4_refit"):
            from patchkit.patches.vllm.refit import refit_weights

            model = dummy_started(new_model(config), config)
            pointers = {n: p.data_ptr() for n, p in model.named_parameters()}
            findings["dummy_mismatches"] = len(served_mismatches(model, references[0]))
            refits = []
            for step in (0, 1, 0):
                refit_weights(model, export_stream(steps[step], "per_expert"))
                refits.append(served_mismatches(model, references[step]))
            findings["refit_mismatches"] = refits
            findings["refit_kept_addresses"] = {n: p.data_ptr() for n, p in model.named_parameters()} == pointers
    print(json.dumps(findings))


if __name__ == "__main__":
    main()
