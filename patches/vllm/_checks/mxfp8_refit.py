"""Self-check of ``vllm.mxfp8_refit``: ModelOpt MXFP8 checkpoints refitted into vLLM's own MXFP8 layers."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, NeedsGPU, SelfCheckFailed, expect


def check_mxfp8_refit(context: CheckContext) -> None:
    """Load one MXFP8 checkpoint, refit another, refit back, into the fused-MoE layer and (vLLM 0.24-0.29)
    the linear layers: each time the kernel tensors equal vLLM's own first load of that checkpoint bit for
    bit, in the same tensor objects and storage."""
    from ..refit import refit
    from ._cpu_stand_in import vllm_context
    from ._mxfp8 import checkpoint as make_checkpoint
    from ._mxfp8 import differing, emulation_backends, first_load, has_linear_method, identities, items, kernel_bytes

    device = context.device
    with vllm_context(device), emulation_backends(device):
        kinds = ["moe", "linear"] if has_linear_method() else ["moe"]
        for kind in kinds:
            first, second = make_checkpoint(kind, seed=1), make_checkpoint(kind, seed=2)
            what = f"vLLM's ModelOpt MXFP8 {'fused-MoE layer' if kind == 'moe' else 'linear layers'}"
            try:
                model = first_load(kind, first, device)
            except ValueError as exc:  # no MXFP8 kernel or MoE backend for this device
                raise NeedsGPU(f"vLLM selects no MXFP8 {kind} kernel here ({str(exc)[:160]})") from exc
            loaded = {"the first checkpoint": kernel_bytes(model)}
            before = identities(model)
            for step, weights, name in (("refit with a second checkpoint", second, "the second checkpoint"),
                                        ("refit back", first, "the first checkpoint")):
                try:
                    with refit(model):
                        model.load_weights(items(weights, device))
                except Exception as exc:
                    raise SelfCheckFailed(
                        f"{step} of {what}", "the layer takes the new weights",
                        f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}") from exc
                if name not in loaded:
                    loaded[name] = kernel_bytes(first_load(kind, weights, device))
                wrong = differing(model, loaded[name])
                expect(not wrong, f"after the {step} of {what} the kernel tensors equal vLLM's own first load"
                       f" of {name}", "all of them, bit for bit", wrong)
                moved = sorted(k for k, v in identities(model).items() if before.get(k) != v)
                expect(not moved, f"the {step} of {what} keeps every kernel tensor (same object, same storage)",
                       "none replaced", moved)
