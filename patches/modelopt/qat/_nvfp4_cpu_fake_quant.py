"""A pure-torch NVFP4 (E2M1 values, E4M3 block scales) fake-quant backend for ModelOpt.

Stock ModelOpt fake-quantizes NVFP4 only on CUDA (``tensor_quant._dynamic_block_quantize_impl``
asserts ``amax.is_cuda`` and dispatches to the Triton kernel ``fp4_fake_quant_block`` or the
``cuda_ext_mx`` extension). This module reproduces the Triton kernel's arithmetic
(``modelopt/torch/kernels/quantization/common/nvfp4_quant.py``, 0.47) step by step in float32 torch
ops, so QAT code runs in CPU CI; ``tests/modelopt/test_nvfp4_gpu.py`` checks it against the kernel.

The kernel's treatment of degenerate scales changed in 0.48 (``gemm/fp4_kernel_hopper.py`` and
``common/nvfp4_quant.py::nvfp4_scalar_quant``), and the backend follows the installed release (one
patch variant each, :data:`RULE_047` / :data:`RULE_048`):

* up to 0.47: a zero global scale becomes 1e-12; a block scale below **1e-5 is replaced by 1**, so a
  block of small values (amax below about 6e-5 x the tensor's) rounds to zero;
* 0.48: a zero, infinite or NaN global scale gives every block the unit scale; small nonzero block
  scales **quantize normally**, and only a block whose FP8 scale is exactly zero is zeroed.

It is registered through ModelOpt's public ``register_quant_backend`` and is used only by quantizers
whose config names it (``"backend": BACKEND_NAME``), which ``build_qat_config`` does while the
patch ``modelopt.nvfp4_cpu_fake_quant`` is applied.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from modelopt.torch.quantization.nn.modules.tensor_quantizer import (
    is_registered_quant_backend,
    register_quant_backend,
    unregister_quant_backend,
)

from .._constants import CPU_BACKEND_NAME as BACKEND_NAME

FP4_E2M1_MAX = 6.0
FP8_E4M3_MAX = 448.0
#: Decision boundaries between the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, and which side a tie
#: goes to, as in the kernel's ``fp4_round_magnitude``: ``<=`` at 0.25, 1.25, 2.5, 5.0 (round to
#: the even mantissa below) and ``<`` at 0.75, 1.75, 3.5 (round up).
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
#: How the installed ModelOpt's kernel treats degenerate scales (see the module docstring).
RULE_047 = "unit_below_1e-5"
RULE_048 = "zero_scale_only"
RULES = (RULE_047, RULE_048)
_BOUNDARIES = ((0.25, True), (0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False), (5.0, True))


def fp4_round_magnitude(abs_scaled: torch.Tensor) -> torch.Tensor:
    """Round non-negative values to the nearest E2M1 magnitude, ties as the Triton kernel."""
    result = torch.full_like(abs_scaled, _E2M1_MAGNITUDES[-1])
    # Walk from the top boundary down so each lower interval overwrites the ones above it.
    for index in range(len(_BOUNDARIES) - 1, -1, -1):
        boundary, inclusive = _BOUNDARIES[index]
        below = abs_scaled <= boundary if inclusive else abs_scaled < boundary
        result = torch.where(below, _E2M1_MAGNITUDES[index], result)
    return result


@functools.lru_cache(maxsize=1)
def installed_release_rule() -> str:
    """The rule of the installed ModelOpt: :data:`RULE_048` from 0.48.0rc0 (pre-releases count), else 0.47's."""
    from importlib.metadata import version

    from packaging.version import Version

    return RULE_048 if Version(version("nvidia-modelopt")) >= Version("0.48.0rc0") else RULE_047


def nvfp4_fake_quantize(inputs: torch.Tensor, global_amax: torch.Tensor, block_size: int = 16,
                        rule: str | None = None) -> torch.Tensor:
    """Fake-quantize ``inputs`` to NVFP4 along its last dimension, in blocks of ``block_size``.

    Mirrors ``fp4_fake_quant_kernel``: per-tensor scale ``global_amax / (6 * 448)``; per-block scale
    ``block_amax / 6`` rounded through FP8 E4M3 (saturated at 448) relative to it; degenerate scales
    handled by ``rule`` (:data:`RULE_047`: a block scale below 1e-5 becomes 1; :data:`RULE_048`: only
    a zero block scale, which zeroes its block; ``None``: the installed release's); values rounded to
    E2M1 magnitudes, sign restored. A last block shorter than ``block_size`` is zero-padded, as the
    kernel's boundary-checked loads do.
    """
    if rule is None:
        rule = installed_release_rule()
    if rule not in RULES:
        raise ValueError(f"unknown tiny-scale rule {rule!r}; expected one of {RULES}")
    if inputs.dim() == 0:
        raise ValueError("NVFP4 quantizes blocks along the last dimension; got a 0-dimensional tensor")
    shape, dtype = inputs.shape, inputs.dtype
    rows = inputs.reshape(-1, shape[-1]).float()
    padding = (-rows.shape[-1]) % block_size
    if padding:
        rows = torch.nn.functional.pad(rows, (0, padding))
    blocks = rows.reshape(rows.shape[0], -1, block_size)

    global_scale = global_amax.detach().float().to(blocks.device).amax() / (FP4_E2M1_MAX * FP8_E4M3_MAX)
    if rule == RULE_047:
        global_scale = torch.where(global_scale > 0.0, global_scale, torch.full_like(global_scale, 1e-12))
    else:  # 0.48: a zero, inf or NaN global scale gives the unit block scale
        valid = (global_scale > 0.0) & (global_scale < float("inf"))
        global_scale = torch.where(valid, global_scale, torch.ones_like(global_scale))

    block_amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale_in_fp8_range = torch.clamp(block_amax / (FP4_E2M1_MAX * global_scale), max=FP8_E4M3_MAX)
    block_scale = scale_in_fp8_range.to(torch.float8_e4m3fn).float() * global_scale
    if rule == RULE_047:
        block_scale = torch.where(block_scale >= 1e-5, block_scale, torch.ones_like(block_scale))
        zero_scale = None
    else:
        block_scale = torch.where(valid, block_scale, torch.ones_like(block_scale))
        zero_scale = block_scale == 0.0
        degenerate = zero_scale | block_scale.isnan() | block_scale.isinf()
        block_scale = torch.where(degenerate, torch.ones_like(block_scale), block_scale)

    magnitudes = fp4_round_magnitude(blocks.abs() / block_scale) * block_scale
    quantized = torch.where(blocks >= 0, magnitudes, -magnitudes)
    if zero_scale is not None:
        quantized = torch.where(zero_scale, torch.zeros_like(quantized), quantized)
    quantized = quantized.reshape(rows.shape)[:, : rows.shape[-1] - padding]
    return quantized.reshape(shape).to(dtype)


class _NVFP4FakeQuant(torch.autograd.Function):
    """Straight-through gradient, as ModelOpt's ``DynamicBlockQuantizationFunction.backward``.

    With ``pass_through_bwd`` the gradient passes unchanged; otherwise it is zeroed where
    ``|x| > amax`` (``_fake_tensor_quant_backward``).
    """

    @staticmethod
    def forward(ctx, inputs, global_amax, block_size, pass_through_bwd, rule):  # type: ignore[override]
        if not pass_through_bwd:
            ctx.save_for_backward(inputs, global_amax)
        return nvfp4_fake_quantize(inputs, global_amax, block_size, rule)

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        if not ctx.saved_tensors:
            return grad_outputs, None, None, None, None
        inputs, amax = ctx.saved_tensors
        return torch.where(inputs.abs() <= amax.to(inputs.dtype), grad_outputs, 0.0), None, None, None, None


def _block_size(quantizer) -> int:
    block_sizes = quantizer.block_sizes or {}
    size = block_sizes.get(-1)
    if size is None:
        raise NotImplementedError(
            f"{BACKEND_NAME} quantizes blocks along the last dimension only; "
            f"quantizer asks for block_sizes={block_sizes}"
        )
    return int(size)


def backend_entrypoint(inputs: torch.Tensor, quantizer, rule: str = RULE_047) -> torch.Tensor:
    """ModelOpt backend entry point: ``(inputs, TensorQuantizer) -> fake-quantized inputs``.

    Accepts exactly the NVFP4 dynamic-block setting (``num_bits=(2, 1)``, ``scale_bits=(4, 3)``,
    ``type="dynamic"``) and refuses anything else rather than quantizing it wrongly.
    """
    block_sizes = quantizer.block_sizes or {}
    asked = (tuple(quantizer.num_bits) if isinstance(quantizer.num_bits, (tuple, list)) else quantizer.num_bits,
             block_sizes.get("scale_bits"), block_sizes.get("type"))
    if asked != ((2, 1), (4, 3), "dynamic"):
        raise NotImplementedError(
            f"{BACKEND_NAME} implements NVFP4 only (num_bits=(2, 1), scale_bits=(4, 3), type='dynamic'); "
            f"quantizer asks for num_bits={asked[0]}, scale_bits={asked[1]}, type={asked[2]}"
        )
    # The same amax ModelOpt's own _fake_quantize would pass to the kernel: the calibrated one, else
    # the dynamic max of the input; the kernel reduces a non-scalar amax to its maximum.
    amax = quantizer._get_amax(inputs)
    if amax is None:
        amax = inputs.detach().abs().amax()
    amax = torch.as_tensor(amax, device=inputs.device).float().amax()
    return _NVFP4FakeQuant.apply(inputs, amax, _block_size(quantizer), bool(quantizer._pass_through_bwd), rule)


#: The rule of the variant installed last (``None`` while none is); for tests and ``patchkit explain``.
installed_rule: str | None = None


def _install(rule: str) -> None:
    global installed_rule
    if is_registered_quant_backend(BACKEND_NAME):
        raise RuntimeError(f"a ModelOpt quant backend named {BACKEND_NAME!r} is already registered")
    entrypoint: Callable[..., torch.Tensor] = functools.partial(backend_entrypoint, rule=rule)
    register_quant_backend(BACKEND_NAME, entrypoint)
    installed_rule = rule


def install() -> None:
    """Register the backend (ModelOpt 0.43-0.47 rule); refuse to replace a foreign backend of the same name."""
    _install(RULE_047)


def install_v048() -> None:
    """Register the backend with ModelOpt 0.48's rule for degenerate scales."""
    _install(RULE_048)


def uninstall() -> None:
    """Remove the backend from ModelOpt's registry."""
    global installed_rule
    unregister_quant_backend(BACKEND_NAME)
    installed_rule = None
