"""On a CUDA GPU: QAT with ModelOpt's own NVFP4 kernel, and the CPU backend against that kernel.

Marked ``gpu``; skipped without CUDA. The max abs difference between patchkit's pure-torch backend
and ModelOpt's kernel is logged, recorded as a test property, and appended as JSON lines to the
file named by ``PATCHKIT_GPU_REPORT`` when it is set.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
import torch
from modelopt.torch.quantization.nn import TensorQuantizer
from patchkit.patches.modelopt.qat import apply_qat
from patchkit.patches.modelopt.qat._checks._nvfp4_grid import at_rounding_tie
from qat_fixtures import SEQ_LEN, VOCAB_SIZE, assert_blocks_on_fp4_grid, batch, build_tiny_moe_gpt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
logger = logging.getLogger("patchkit.tests.gpu")
NVFP4 = {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": (4, 3)}}


def _report(record_property, **fields: Any) -> None:
    logger.warning("GPU result: %s", fields)
    for key, value in fields.items():
        record_property(key, value)
    path = os.environ.get("PATCHKIT_GPU_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(fields) + "\n")


def _modelopt_kernel(weight: torch.Tensor) -> torch.Tensor:
    """ModelOpt's stock NVFP4 fake quantization of a CUDA tensor (Triton kernel on sm_89+)."""
    quantizer = TensorQuantizer().to(weight.device)
    quantizer.set_from_attribute_config(NVFP4)
    with torch.no_grad():
        return quantizer(weight)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_cpu_backend_matches_modelopts_cuda_kernel(dtype, record_property):
    from patchkit.patches.modelopt.qat._nvfp4_cpu_fake_quant import nvfp4_fake_quantize

    generator = torch.Generator().manual_seed(0)
    shapes = [(128, 256), (512, 1024), (3, 64, 160), (4096, 64)]
    worst_cpu = worst_cuda = worst_off_tie = 0.0
    mismatched = off_tie = beyond_one_ulp_off_tie = ties = total = 0
    for shape in shapes:
        weight = (torch.randn(*shape, generator=generator) * torch.logspace(-3, 1, shape[-1])).to(dtype)
        reference = _modelopt_kernel(weight.cuda()).cpu()
        amax = weight.float().abs().amax()
        on_cpu = nvfp4_fake_quantize(weight, amax, 16)
        on_cuda = nvfp4_fake_quantize(weight.cuda(), amax.cuda(), 16).cpu()
        tie = at_rounding_tie(weight, amax)
        differs = on_cpu != reference
        worst_cpu = max(worst_cpu, (on_cpu.float() - reference.float()).abs().max().item())
        worst_cuda = max(worst_cuda, (on_cuda.float() - reference.float()).abs().max().item())
        # One unit in the last place of the output dtype at each reference value: the kernel rounds
        # its fp32 result to bf16 on store differently from torch's round-to-nearest-even.
        ulp = (torch.nextafter(reference.abs(), torch.tensor(float("inf"), dtype=dtype)) - reference.abs()).float()
        gap = (on_cpu.float() - reference.float()).abs()
        worst_off_tie = max(worst_off_tie, gap[~tie].max().item())
        beyond_one_ulp_off_tie += int(((gap > ulp) & ~tie).sum())
        mismatched += int(differs.sum())
        off_tie += int((differs & ~tie).sum())
        ties += int(tie.sum())
        total += reference.numel()
    _report(record_property, test="cpu_backend_vs_cuda_kernel", dtype=str(dtype),
            max_abs_diff_cpu=worst_cpu, max_abs_diff_torch_on_cuda=worst_cuda,
            max_abs_diff_off_ties=worst_off_tie, mismatched=mismatched, mismatched_off_ties=off_tie,
            beyond_one_output_ulp_off_ties=beyond_one_ulp_off_tie, rounding_ties=ties, elements=total,
            device=torch.cuda.get_device_name())
    # Away from exact E2M1 rounding ties (where the kernel's approximate division decides, and a
    # value may land one E2M1 step away) the results agree to one unit of the output dtype; in
    # float32 and float16 they are bit-identical there.
    assert beyond_one_ulp_off_tie == 0
    if dtype != torch.bfloat16:
        assert off_tie == 0 and worst_off_tie == 0.0


def _tiny_block_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """Weights with blocks whose FP8 block scale lies below 1e-5 (0.47 replaces it by 1, 0.48 keeps it)
    and blocks whose scale underflows to zero, beside ordinary blocks of the same tensor."""
    generator = torch.Generator().manual_seed(1)
    weights = []
    for scale in (1e-4, 1e-3, 1.0):
        weight = torch.randn(64, 256, generator=generator) * scale
        weight[:, 16:32] *= 0.4      # block scale about 0.4 x 448 x global scale: below 1e-5 when scale = 1e-4
        weight[:, 48:64] *= 0.05     # smaller still
        weight[:, 96:112] *= 1e-7    # FP8 block scale underflows to zero
        weight[:, 128:144] = 0.0     # an all-zero block
        weight[::7, 160:176] *= 1e-3  # some rows only
        weights.append(weight.to(dtype))
    return weights


#: Measured on an H200 (ModelOpt 0.47.0 and 0.48.0rc1 alike): in fp16, 15 of 49,152 elements of the
#: tiny-block weights differ from the kernel by more than one output ulp off rounding ties; bf16 and
#: fp32 have none. Not diagnosed yet (fp16 subnormal outputs are the suspects); kept strict so a fix shows.
_FP16_TINY_GAP = pytest.mark.xfail(strict=True, reason="fp16 tiny blocks: 15/49,152 elements beyond one ulp "
                                   "of ModelOpt's kernel on an H200 (see the comment above)")


@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float16, marks=_FP16_TINY_GAP), torch.float32])
def test_tiny_blocks_match_modelopts_cuda_kernel(dtype, record_property):
    """The installed release's rule for tiny block scales, against that release's own kernel."""
    from patchkit.patches.modelopt.qat._nvfp4_cpu_fake_quant import (
        RULE_047,
        RULE_048,
        installed_release_rule,
        nvfp4_fake_quantize,
    )

    rule = installed_release_rule()
    other = RULE_047 if rule == RULE_048 else RULE_048
    beyond_one_ulp_off_tie = tiny_blocks = distinguishing = total = 0
    for weight in _tiny_block_weights(dtype):
        reference = _modelopt_kernel(weight.cuda()).cpu()
        amax = weight.float().abs().amax()
        ours = nvfp4_fake_quantize(weight, amax, 16, rule)
        wrong_rule = nvfp4_fake_quantize(weight, amax, 16, other)
        tie = at_rounding_tie(weight, amax, rule=rule)
        ulp = (torch.nextafter(reference.abs(), torch.tensor(float("inf"), dtype=dtype)) - reference.abs()).float()
        gap = (ours.float() - reference.float()).abs()
        beyond_one_ulp_off_tie += int(((gap > ulp) & ~tie).sum())
        distinguishing += int((wrong_rule != reference).sum())
        blocks = weight.float().reshape(weight.shape[0], -1, 16).abs().amax(-1)
        tiny_blocks += int((blocks / 6.0 < 1e-5).sum())  # block scale about block amax / 6
        total += reference.numel()
    _report(record_property, test="tiny_blocks_vs_cuda_kernel", dtype=str(dtype), rule=rule,
            beyond_one_output_ulp_off_ties=beyond_one_ulp_off_tie, elements_the_other_rule_gets_wrong=distinguishing,
            tiny_blocks=tiny_blocks, elements=total, device=torch.cuda.get_device_name())
    assert beyond_one_ulp_off_tie == 0
    assert distinguishing > 0  # the inputs do tell the two rules apart


def test_qat_forward_backward_with_modelopts_cuda_kernel(megatron_gpu, record_property):
    model = build_tiny_moe_gpt(use_cpu_initialization=False).cuda()
    apply_qat(model, backend=None)
    enabled = [n for n, m in model.named_modules() if n.endswith("weight_quantizer") and isinstance(m, TensorQuantizer)
               and m.is_enabled]
    assert enabled and not any(n.startswith(("output_layer", "mtp.")) for n in enabled)
    assert all(m.backend is None for n, m in model.named_modules() if n in enabled)
    inputs = {k: v.cuda() for k, v in batch().items()}
    loss = model(**inputs)
    assert loss.shape == (2, SEQ_LEN) and torch.isfinite(loss).all()
    loss.mean().backward()
    qkv = model.decoder.layers[0].self_attention.linear_qkv
    assert qkv.weight.grad is not None and qkv.weight.grad.abs().sum() > 0
    blocks = 0
    for name in enabled:
        module = model.get_submodule(name.rsplit(".", 1)[0])
        with torch.no_grad():
            blocks += assert_blocks_on_fp4_grid(module.weight.cpu(), module.weight_quantizer(module.weight).cpu())
    _report(record_property, test="qat_forward_backward_cuda", enabled_weight_quantizers=len(enabled),
            blocks_checked=blocks, loss=float(loss.mean()), vocab=VOCAB_SIZE)
