"""Real vLLM layers on a machine without CUDA, for the vLLM self-check (and the tests, which share it).

Redirects, each reverted on exit, nothing else of vLLM replaced:

- ``vllm.model_executor.kernels.linear._POSSIBLE_NVFP4_KERNELS[<CPU platform>]`` is set to
  ``[EmulationNvFp4LinearKernel]``. Upstream lists its emulation kernel (a dequantise-then-matmul in
  torch) only for CUDA and ROCm, so on CPU ``init_nvfp4_linear_kernel`` finds no kernel. The
  emulation kernel itself is vLLM's, unchanged.
- ``Nvfp4QuantizationEmulationTritonExperts._supports_current_device`` answers True, so the NVFP4 MoE
  oracle selects its emulation backend and MoE layers can be built and processed on CPU.

- :func:`cpu_fp8_quant` (CPU only, where vLLM's compiled ``_C`` library lacks them, as in its PyPI
  wheel): ``torch.ops._C.static_scaled_fp8_quant`` registered, written in torch (per-tensor only:
  ``x / scale`` clamped to +-448 and cast to the output's FP8 type), and ``dynamic_scaled_fp8_quant``
  (the same, with scale = amax / 448 computed first). vLLM's FP8 processing requantises every
  per-tensor weight with the static op (``requantize_with_max_scale``), and online FP8 quantises bf16
  weights with one or the other (0.29+: static at amax / 448; 0.24: dynamic); removed on exit.
- :func:`cpu_platform`: vLLM's CPU platform where none was resolved (vLLM 0.24's PyPI wheel).
- :func:`cpu_activation_op` only (whole models built on CPU): ``torch.ops._C.silu_and_mul`` registered,
  written in torch, where vLLM's CPU wheel lacks it (vLLM 0.29's ``SiluAndMul`` looks it up as an MLP is
  built); removed on exit.
- :func:`cpu_marlin_layout` only (W4A16 checks): ``MarlinNvFp4LinearKernel.is_supported`` answers True
  and the CUDA op ``gptq_marlin_repack`` is replaced by a reshape to the shape Marlin returns, so
  W4A16 (Marlin) layers are built and processed on CPU by vLLM's own code; the repacked weight is a
  stand-in layout, not Marlin's, and no Marlin forward can run.

:func:`vllm_context` starts what vLLM layers need to be built (a current ``VllmConfig`` and
model-parallel state of world size 1) unless the process already has it, and tears down what it started.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def single_process_group(backend: str) -> str:
    """torch.distributed's group of one on an in-memory store, started here unless the process has one;
    the init method for vLLM, which then uses that group. No port is picked first (and lost to another
    process before it is bound)."""
    import torch

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(backend, store=torch.distributed.HashStore(), rank=0, world_size=1)
    return "env://"


@contextlib.contextmanager
def vllm_config(backend: str = "gloo") -> Iterator[object]:
    """A current default ``VllmConfig`` and vLLM's model-parallel state (world size 1), started here.

    No ``ModelConfig``: linear and MoE layers do not read one, and building one (Hugging Face config
    resolution, vLLM's model-registry inspection in a subprocess) costs a minute on a busy 2-core machine.
    """
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    config = VllmConfig()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=single_process_group(backend), backend=backend)
        initialize_model_parallel(1, 1)
        yield config


@contextlib.contextmanager
def model_config_fields(**fields: Any) -> Iterator[None]:
    """What a layer reads of the model config (``fields``, e.g. its ``dtype``), for the block, where the
    current vLLM config has no ``ModelConfig`` (the doctor's :func:`vllm_config`); a real one is left as is."""
    from types import SimpleNamespace

    from vllm.config import get_current_vllm_config

    config = get_current_vllm_config()
    if config.model_config is not None:
        yield
        return
    object.__setattr__(config, "model_config", SimpleNamespace(**fields))
    try:
        yield
    finally:
        object.__setattr__(config, "model_config", None)


@contextlib.contextmanager
def vllm_context(device: str) -> Iterator[None]:
    """vLLM's config and model-parallel state (reused if the process has them) and, on CPU, the redirects."""
    from vllm.distributed import parallel_state

    with contextlib.ExitStack() as stack:
        if device == "cpu":
            stack.enter_context(cpu_platform())
        if not parallel_state.model_parallel_is_initialized():
            stack.callback(_tear_down)
            stack.enter_context(vllm_config("gloo" if device == "cpu" else "nccl"))
        if device == "cpu":
            stack.enter_context(cpu_nvfp4_kernels())
            stack.enter_context(cpu_fp8_quant())
        yield


@contextlib.contextmanager
def cpu_platform() -> Iterator[None]:
    """vLLM's CPU platform while no platform was resolved (vLLM 0.24's PyPI wheel without CUDA).

    vLLM 0.24 detects its CPU platform only from a ``+cpu`` version suffix (its CPU wheels); the
    PyPI (CUDA) wheel on a machine without CUDA resolves to ``UnspecifiedPlatform``, on which layers
    cannot be built ("Failed to infer device type"). Later releases select CPU themselves and are
    left alone. The resolved platform comes back on exit.
    """
    import vllm.platforms as platforms

    if platforms.current_platform.device_type:
        yield
        return
    from vllm.platforms.cpu import CpuPlatform

    saved = platforms._current_platform
    platforms._current_platform = CpuPlatform()
    try:
        yield
    finally:
        platforms._current_platform = saved


def _tear_down() -> None:
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()


@contextlib.contextmanager
def cpu_nvfp4_kernels() -> Iterator[None]:
    """Register vLLM's NVFP4 emulation kernels for the CPU platform (see the module docstring)."""
    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts as EmulationExperts,
    )
    from vllm.platforms import current_platform

    table = linear_kernels._POSSIBLE_NVFP4_KERNELS
    # The kernel module may hold the platform resolved when it was imported (vLLM 0.24 imports
    # ``current_platform`` at module level): register for that one and the current one.
    enums = {current_platform._enum, getattr(linear_kernels, "current_platform", current_platform)._enum}
    saved_linear = {platform: table.get(platform) for platform in enums}
    saved_device_check = EmulationExperts.__dict__.get("_supports_current_device")
    for platform in enums:
        table[platform] = [EmulationNvFp4LinearKernel]
    EmulationExperts._supports_current_device = staticmethod(lambda: True)
    try:
        yield
    finally:
        for platform, saved in saved_linear.items():
            if saved is None:
                table.pop(platform, None)
            else:
                table[platform] = saved
        if saved_device_check is None:
            del EmulationExperts._supports_current_device
        else:
            EmulationExperts._supports_current_device = saved_device_check


_FP8_E4M3_MAX = 448.0


def _static_scaled_fp8_quant(result: Any, input: Any, scale: Any, group_shape: list[int] | None = None) -> None:
    if scale.numel() != 1:
        raise NotImplementedError("patchkit's CPU stand-in of static_scaled_fp8_quant is per-tensor only")
    result.copy_((input.float() / scale.float()).clamp(-_FP8_E4M3_MAX, _FP8_E4M3_MAX).to(result.dtype))


def _dynamic_scaled_fp8_quant(result: Any, input: Any, scale: Any) -> None:
    scale.fill_(input.abs().max().float().clamp(min=1e-12) / _FP8_E4M3_MAX)
    result.copy_((input.float() / scale).clamp(-_FP8_E4M3_MAX, _FP8_E4M3_MAX).to(result.dtype))


#: op name -> (schema, torch implementation)
_FP8_QUANT_OPS = {
    "static_scaled_fp8_quant": (
        "static_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()",
        _static_scaled_fp8_quant,
    ),
    "dynamic_scaled_fp8_quant": (
        "dynamic_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor(b!) scale) -> ()",
        _dynamic_scaled_fp8_quant,
    ),
}


@contextlib.contextmanager
def cpu_fp8_quant() -> Iterator[None]:
    """``torch.ops._C.static_scaled_fp8_quant`` and ``dynamic_scaled_fp8_quant`` in torch where vLLM's build
    lacks them (module docstring)."""
    import torch

    with contextlib.ExitStack() as stack:
        missing = [name for name in _FP8_QUANT_OPS if not hasattr(torch.ops._C, name)]
        if missing:
            library = torch.library.Library("_C", "FRAGMENT")
            for name in missing:
                schema, implementation = _FP8_QUANT_OPS[name]
                library.define(schema)
                library.impl(name, implementation, "CompositeExplicitAutograd")
                # torch.ops caches the resolved packet: drop it with the library
                stack.callback(torch.ops._C.__dict__.pop, name, None)
            stack.callback(library._destroy)
        yield


@contextlib.contextmanager
def cpu_marlin_layout() -> Iterator[None]:
    """W4A16 (Marlin) NVFP4 linear layers buildable and processable on CPU (see the module docstring)."""
    import torch
    import vllm._custom_ops as ops
    from vllm.model_executor.kernels.linear.nvfp4.marlin import MarlinNvFp4LinearKernel

    def repack_standin(b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int,
                       **_: object) -> torch.Tensor:  # 0.24 passes perm=, 0.33 is_a_8bit=
        assert num_bits == 4
        return b_q_weight.reshape(size_k // 16, size_n * 16 // 8).clone()

    saved_repack = ops.gptq_marlin_repack
    saved_supported = MarlinNvFp4LinearKernel.__dict__["is_supported"]
    ops.gptq_marlin_repack = repack_standin
    MarlinNvFp4LinearKernel.is_supported = classmethod(lambda cls, compute_capability=None: (True, None))
    try:
        yield
    finally:
        ops.gptq_marlin_repack = saved_repack
        MarlinNvFp4LinearKernel.is_supported = saved_supported


def _silu_and_mul(result: Any, input: Any) -> None:
    import torch

    half = input.shape[-1] // 2
    result.copy_(torch.nn.functional.silu(input[..., :half]) * input[..., half:])


@contextlib.contextmanager
def cpu_activation_op() -> Iterator[None]:
    """``torch.ops._C.silu_and_mul`` (the SwiGLU of vLLM's ``forward_native``) where vLLM's CPU wheel has none:
    vLLM 0.29's ``SiluAndMul`` looks it up as a model's MLP is built. Registered only when missing, and
    removed on exit."""
    import torch

    if hasattr(torch.ops._C, "silu_and_mul"):
        yield
        return
    library = torch.library.Library("_C", "FRAGMENT")
    library.define("silu_and_mul(Tensor! result, Tensor input) -> ()")
    library.impl("silu_and_mul", _silu_and_mul, "CompositeExplicitAutograd")
    try:
        yield
    finally:
        library._destroy()
        torch.ops._C.__dict__.pop("silu_and_mul", None)  # torch.ops caches resolved overload packets
