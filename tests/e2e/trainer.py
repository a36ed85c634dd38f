"""The trainer side of the end-to-end tests: tiny QAT Megatron GPTs after real training steps, and
what their QAT layers compute (the references vLLM must reproduce).

A "trained state" is ``export_models.build_gpt`` (dense or MoE, SwiGLU, local specs) with
``apply_qat(model, "w4a16_nvfp4")`` (patchkit's CPU fake-quant backend, which reproduces ModelOpt's
kernel), then ``steps`` SGD steps on a language-model loss through the QAT forward/backward.
ModelOpt keeps the calibrated weight amax during training, so the trained fake-quant uses it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from export_models import build_gpt, qat
from nvfp4_helpers import exact_activations
from qat_fixtures import batch

ROWS = 5
#: The input scale given to vLLM's W4A4 layers (see ``serving.with_input_scales``). 1.0 makes vLLM's
#: activation global scale 1, so ``exact_activations`` pass its activation quantization unchanged.
INPUT_SCALE = 1.0


@dataclass
class LinearReference:
    fake_quant: torch.Tensor  # weight_quantizer(weight): what the trainer's forward multiplies
    x_exact: torch.Tensor | None = None  # activations NVFP4 activation quantization leaves unchanged
    out_exact: torch.Tensor | None = None  # the trainer's QAT layer on x_exact
    x_random: torch.Tensor | None = None
    out_random: torch.Tensor | None = None  # the trainer's QAT layer on x_random (W4A16)
    out_random_a4: torch.Tensor | None = None  # the trainer's layer on vLLM's quant-dequant of x_random


@dataclass
class TrainedState:
    model: torch.nn.Module
    dtype: torch.dtype
    linears: dict[str, LinearReference] = field(default_factory=dict)


def trained_state(moe: bool, dtype: torch.dtype, steps: int, seed: int = 0) -> TrainedState:
    from patchkit.patches.megatron._checks._cpu_stand_in import cpu_megatron

    with cpu_megatron():
        model = qat(build_gpt(moe, dtype=dtype, seed=seed))
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        for step in range(steps):
            optimizer.zero_grad()
            model(**batch(seed=step)).float().mean().backward()
            optimizer.step()
        model.zero_grad(set_to_none=True)
        state = TrainedState(model, dtype)
        _references(state)
    return state


@torch.no_grad()
def _references(state: TrainedState) -> None:
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant

    generator = torch.Generator().manual_seed(11)
    for name, module in state.model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if not getattr(quantizer, "is_enabled", False):
            continue
        reference = LinearReference(fake_quant=quantizer(module.weight).detach().clone())
        state.linears[name] = reference
        if ".local_experts." in name:
            continue  # experts: weights only (vLLM's NVFP4 MoE forward is Triton-only)
        in_features = module.weight.shape[1]
        reference.x_exact = exact_activations(ROWS, in_features, seed=len(state.linears)).to(state.dtype)
        reference.out_exact = _layer(module, reference.x_exact)
        reference.x_random = torch.randn(ROWS, in_features, generator=generator).to(state.dtype)
        reference.out_random = _layer(module, reference.x_random)
        # vLLM's emulation kernel quantizes activations with global scale 1 / input_scale.
        x_a4 = ref_nvfp4_quant_dequant(reference.x_random, torch.tensor(1.0 / INPUT_SCALE), 16)
        reference.out_random_a4 = _layer(module, x_a4)


def _layer(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The Megatron QAT linear's forward ([s, b, h] in, [s, b, out] out) on [rows, in]."""
    out, _ = module(x.unsqueeze(1))
    return out.squeeze(1).detach().clone()
