"""Self-check of ``vllm.moe_expert_weight_loaders`` (native: vLLM keeps the loaders itself): every expert
parameter of vLLM's ModelOpt NVFP4 fused-MoE layer keeps the routed layer's ``weight_loader`` after processing."""

from __future__ import annotations

from patchkit.selfcheck import CheckContext, NeedsGPU, expect

from ._tiny_moe import is_the_layers_loader, loaders_of, processed_tiny_moe


def check_moe_expert_weight_loaders(context: CheckContext) -> None:
    """After vLLM's processing every fused-MoE expert parameter still has the routed layer's ``weight_loader``."""
    try:
        model = processed_tiny_moe(context.device)
    except NotImplementedError as exc:  # vLLM's NVFP4 MoE oracle found no backend for this platform
        raise NeedsGPU(f"vLLM selects no NVFP4 MoE backend here ({str(exc)[:120]}); on vLLM 0.24's PyPI wheel "
                       "without CUDA, the CPU platform must be selected before vLLM is imported") from exc
    without = sorted(name for name, loader in loaders_of(model).items()
                     if not is_the_layers_loader(loader, model.routed))
    expect(not without, "expert parameters of vLLM's ModelOpt NVFP4 fused-MoE layer after its "
           "process_weights_after_loading, each with the routed layer's weight_loader", "all of them",
           f"without it: {without}")
