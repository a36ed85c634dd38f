"""Self-checks of ``vllm.fp8_online_refit`` and ``vllm.fp8_online_moe_refit``: bf16 weights refitted into
vLLM's own online-FP8 layers (``_round_trip`` drives them)."""

from __future__ import annotations

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, expect

from ._round_trip import differing, kernel_bytes, refit_steps


def check_fp8_online_refit(context: CheckContext) -> None:
    """Load one bf16 checkpoint into vLLM's online-FP8 linear layers (``OnlineQuantizationConfig``,
    ``fp8_per_tensor``), refit another, refit back: each time the FP8 weights and scales equal vLLM's own
    first load of that checkpoint bit for bit, in the same tensor objects and storage."""
    from ..._checks._cpu_stand_in import vllm_context

    with vllm_context(context.device):
        _check("linear", "online", context.device)


def check_fp8_online_moe_refit(context: CheckContext) -> None:
    """The same for vLLM 0.24's ``Fp8OnlineMoEMethod`` (a fused-MoE layer under ``Fp8Config`` without an
    FP8-serialised checkpoint)."""
    from ..._checks._cpu_stand_in import vllm_context

    with vllm_context(context.device):
        _check("moe", "fp8", context.device)


def _check(kind: str, config: str, device: str) -> None:
    from ._fp8_online import CHECKPOINTS, first_load, items

    first, second = CHECKPOINTS[kind](seed=1), CHECKPOINTS[kind](seed=2)
    what = f"vLLM's online-FP8 {'fused-MoE layer' if kind == 'moe' else 'linear layers'}"
    try:
        model = first_load(kind, config, first, device)
    except (KeyError, ValueError, NotImplementedError) as exc:  # no FP8 kernel or MoE backend for this device
        raise NeedsGPU(f"vLLM selects no FP8 {kind} kernel or backend here ({str(exc)[:160]})") from exc
    loaded = {id(first): kernel_bytes(model)}
    quantised = [name for name, param in model.named_parameters() if param.dtype == torch.float8_e4m3fn]
    expect(bool(quantised), f"vLLM's first load of bf16 weights into {what} quantises them to FP8",
           "FP8 kernel weights", sorted(n for n, _ in model.named_parameters()))

    def verify(step: str, weights: dict[str, torch.Tensor]) -> None:
        if id(weights) not in loaded:
            loaded[id(weights)] = kernel_bytes(first_load(kind, config, weights, device))
        wrong = differing(model, loaded[id(weights)])
        expect(not wrong, f"after the {step} of {what} the FP8 weights and scales equal vLLM's own first load of"
               " those bf16 weights", "all of them, bit for bit", wrong)

    refit_steps(model, what, (("refit with a second checkpoint", second), ("refit back", first)),
                load=lambda weights: model.load_weights(items(weights, device)), verify=verify)
