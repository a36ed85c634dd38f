"""vLLM's TRITON MXFP4 MoE backend (triton_kernels' fused MoE), built on CPU the way vLLM builds it on Hopper.

vLLM picks ``TRITON`` for gpt-oss MXFP4 layers on an SM90 GPU whenever ``triton_kernels`` imports (the
vllm wheel ships it as ``vllm.third_party.triton_kernels``). Its processing is vLLM's
``_swizzle_mxfp4``: torch code and triton_kernels' ``convert_layout``, which for the Hopper layouts is torch
code too. On CPU, two answers differ from an SM90 GPU's; :func:`triton_backend` stands in for exactly these:

- the Triton experts' device check (``gpt_oss_triton_kernels_moe._triton_kernel_moe_supports_current_device``:
  a CUDA GPU of capability 9.0 to 12.x) answers True, so vLLM's own backend selection picks ``TRITON``
  (``moe_backend="auto"``: gpt-oss's priority list, as on Hopper; ``"triton"``: ``--moe-backend triton``);
- triton_kernels' capability query (``tensor_details.layout.cuda_capability_geq``, a CUDA call) answers as
  an SM90 GPU, so ``_swizzle_mxfp4`` converts to triton_kernels' Hopper layouts (``HopperMXValueLayout``,
  ``HopperMXScaleLayout``).

Not reproduced: the branch of ``_swizzle_mxfp4`` behind vLLM's ``current_platform.is_cuda()`` on SM90 (a
``split_k`` tuning flag for the kernel, no tensor; on 0.29+ the scales padded to a multiple of 4 blocks).
No Triton kernel runs on CPU. tests/vllm/test_mxfp4_moe_refit_triton_gpu.py runs all of it on a GPU.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from patchkit.patches.vllm._checks._cpu_stand_in import model_config_fields


def _as_sm90(major: int, minor: int = 0) -> bool:
    return (9, 0) >= (major, minor)


@contextlib.contextmanager
def triton_backend(moe_backend: str = "triton", device: str = "cpu") -> Iterator[None]:
    """vLLM's TRITON MXFP4 MoE backend for layers built in the block (on CPU: the stand-ins above)."""
    from vllm.config import get_current_vllm_config

    kernel_config = get_current_vllm_config().kernel_config
    saved_backend = kernel_config.moe_backend
    with contextlib.ExitStack() as stack:
        kernel_config.moe_backend = moe_backend
        stack.callback(setattr, kernel_config, "moe_backend", saved_backend)
        stack.enter_context(model_config_fields(quantization_config=None, dtype=torch.bfloat16))
        if device == "cpu":
            from vllm.utils.import_utils import has_triton_kernels

            # vLLM's own import: the wheel's vllm.third_party.triton_kernels, aliased as triton_kernels
            assert has_triton_kernels(), "triton_kernels (shipped in the vllm wheel) does not import"
            import triton_kernels.tensor_details.layout as layout
            import vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe as triton_moe

            saved_check = triton_moe._triton_kernel_moe_supports_current_device
            saved_capability = layout.cuda_capability_geq
            triton_moe._triton_kernel_moe_supports_current_device = lambda: True
            layout.cuda_capability_geq = _as_sm90
            stack.callback(setattr, triton_moe, "_triton_kernel_moe_supports_current_device", saved_check)
            stack.callback(setattr, layout, "cuda_capability_geq", saved_capability)
        yield


def weight_scale(precision_config: Any) -> Any:
    """The triton_kernels scale tensor of a precision config (3.8 names it ``b_mx_scale``)."""
    scale = getattr(precision_config, "weight_scale", None)
    return precision_config.b_mx_scale if scale is None else scale


def triton_tensors(routed: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a TRITON layer's kernel reads: its parameters (float32 biases; on 0.24 the checkpoint scales,
    which stay) and the storage of the triton_kernels weights on the layer and scales in the method's
    precision configs."""
    method = routed.quant_method
    tensors = dict(routed.named_parameters())
    for proj in ("w13", "w2"):
        tensors[f"{proj}_weight"] = vars(routed)[f"{proj}_weight"].storage.data
        tensors[f"{proj}_scale"] = weight_scale(getattr(method, f"{proj}_precision_config")).storage.data
    return tensors


def triton_objects(routed: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Identity of everything the kernel holds: wrappers, precision configs, quant config, kernel, and each
    tensor's object and address."""
    method = routed.quant_method
    held = {
        "w13_weight": vars(routed)["w13_weight"],
        "w2_weight": vars(routed)["w2_weight"],
        "w13_precision_config": method.w13_precision_config,
        "w2_precision_config": method.w2_precision_config,
        "w13_scale": weight_scale(method.w13_precision_config),
        "w2_scale": weight_scale(method.w2_precision_config),
        "moe_quant_config": method.moe_quant_config,
        "moe_kernel": method.moe_kernel,
    }
    ids: dict[str, tuple[int, ...]] = {name: (id(value),) for name, value in held.items()}
    ids.update({f"{name} tensor": (id(t), t.data_ptr()) for name, t in triton_tensors(routed).items()})
    return ids
