"""Self-check of ``vllm.fp8_online_pow2_scales``: vLLM's online-FP8 linear layers quantise bf16 weights at
power-of-two scales."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, expect


def check_fp8_online_pow2_scales(context: CheckContext) -> None:
    """Load bf16 weights into vLLM's online-FP8 linear layers: each scale is the power of two at or just above
    amax / 448, and the FP8 weight is the bf16 weight divided by it (exact at a power-of-two scale: read
    without vLLM)."""
    from ..._checks._cpu_stand_in import vllm_context
    from ._fp8_online import first_load, linear_checkpoint

    weights = linear_checkpoint(seed=1)
    with vllm_context(context.device):
        try:
            model = first_load("linear", "online", weights, context.device)
        except (KeyError, ValueError) as exc:  # no FP8 linear kernel for this device
            raise NeedsGPU(f"vLLM selects no FP8 linear kernel here ({str(exc)[:160]})") from exc
    wrong = []
    for layer_name, names in (("gate_up", ("gate.weight", "up.weight")), ("down", ("down.weight",))):
        layer = getattr(model, layer_name)
        bf16 = torch.cat([weights[name] for name in names]).float()
        scale = layer.weight_scale.detach().float().reshape(()).cpu()
        amax = bf16.abs().max() / 448.0
        if not (scale >= amax and scale < 2 * amax and torch.log2(scale) == torch.round(torch.log2(scale))):
            wrong.append(f"{layer_name}.weight_scale {scale.item()!r} for amax / 448 = {amax.item()!r}")
        want = (bf16 / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        served = layer.weight.detach().t().cpu()
        if not torch.equal(served.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            wrong.append(f"{layer_name}.weight")
    expect(not wrong, "online FP8 quantises at power-of-two scales, rounded up from amax / 448",
           "every scale and weight", wrong)
