"""Real vLLM on CPU: the set-up shared by tests/vllm (conftest fixtures) and benchmarks/bench_refit.py.

Environments: compat_matrix.yaml ``vllm-0.24`` (torch 2.11.0), ``vllm-0.29``/``vllm-0.32`` (torch
2.13.0) and ``vllm-0.33`` (torch 2.14.0), with ``VLLM_TARGET_DEVICE=cpu``. vLLM's model-parallel
state is initialised once per session with the gloo backend (world size 1) inside
``set_current_vllm_config``, as vLLM's own CPU worker does. The config carries a real
``ModelConfig`` read offline from a tiny Llama ``config.json`` (attention layers read the model
dtype from it; no weights or tokenizer are involved).

Harness redirects (test-only, nothing else of vLLM is replaced):

- vLLM 0.24 only: the CPU platform is selected explicitly (``select_cpu_platform``).
- ``vllm.model_executor.kernels.linear._POSSIBLE_NVFP4_KERNELS[PlatformEnum.CPU]`` is set to
  ``[EmulationNvFp4LinearKernel]``. Upstream lists the emulation kernel (a dequantise-then-matmul
  written in torch) only for CUDA and ROCm, so on CPU ``init_nvfp4_linear_kernel`` finds no kernel.
  The emulation kernel itself is vLLM's, unchanged.
- ``Nvfp4QuantizationEmulationTritonExperts._supports_current_device`` answers True, so vLLM's NVFP4
  MoE oracle selects its EMULATION backend and the MoE layer can be built and processed on CPU.
  Its forward needs Triton (GPU), so MoE tests check the processed kernel tensors, not outputs.
- ``cpu_marlin_layout`` only (W4A16 tests): ``MarlinNvFp4LinearKernel.is_supported`` answers True and
  the CUDA op ``gptq_marlin_repack`` is replaced by a reshape to the shape Marlin returns. This
  builds and processes W4A16 (Marlin) layers on CPU through vLLM's own code; the repacked weight is
  a stand-in layout, not Marlin's, and no Marlin forward runs (tests read tensors, not outputs).
- ``cpu_fp8_ops`` only (FP8 refit tests): vLLM's compiled ``_C`` op ``static_scaled_fp8_quant``,
  absent from its PyPI wheel on CPU, is registered in torch (``_cpu_stand_in.cpu_fp8_quant``, shared
  with the self-check: per-tensor ``x / scale`` clamped to +-448, cast to E4M3; processing requantises
  per-tensor weights with it), and so is ``convert_weight_packed`` (a copy in place of the CPU MoE
  backend's VNNI prepack: a stand-in layout). ``TritonFp8BlockScaledMMKernel`` is listed for the CPU
  platform and reports itself supported, so a block-wise linear layer is processed by vLLM's generic
  block path (what CUDA runs); ``TritonExperts`` accepts the CPU device and the FP8 schemes it lists for
  devices with FP8, so the oracle picks it for per-tensor FP8 MoE (block-wise MoE gets vLLM's CPU
  backend, first on CPU). No Triton or CPU-kernel forward runs: those tests read kernel tensors. Both
  sides of every comparison, patchkit's refit and vLLM's own first load, go through the same
  stand-ins; all are removed on exit.
- ``cpu_dynamic_fp8_quant`` only (online-FP8 refit tests, vLLM 0.24): ``dynamic_scaled_fp8_quant`` in
  torch (per-tensor, scale = amax / 448, then the static op's ``x / scale``), which 0.24's online FP8
  methods call as the loader completes a layer (0.29+ compute amax / 448 in torch and call the static op).
  Both sides of every comparison, patchkit's refit and vLLM's own first load, go through it.
- ``cpu_deep_gemm_e8m0`` only (E8M0 FP8 refit tests): vLLM's DeepGEMM decision functions
  (``is_deep_gemm_supported``, ``is_deep_gemm_e8m0_used``) answer True, ``DeepGemmFp8BlockScaledMMKernel`` is
  listed for the CPU platform, and DeepGEMM's compiled scale-layout transform is stood in (the scales as
  given, or a Blackwell-shaped packed int32 layout), so vLLM's UE8M0 requantisation of block-FP8 linear and
  MoE layers runs on CPU. No DeepGEMM GEMM runs: those tests read kernel tensors.
- ``cpu_activation_op`` only (whole models, logits tests): where vLLM's CPU wheel lacks the compiled
  ``_C`` op ``silu_and_mul`` (0.29: ``SiluAndMul`` looks it up as a Llama MLP is built), it is
  registered in torch as the SwiGLU vLLM's ``forward_native`` computes, and removed on exit.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # vLLM picks its platform from this at first use
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def select_cpu_platform() -> None:
    """vLLM 0.24 detects its CPU platform only from a ``+cpu`` version suffix (its CPU wheels), not
    from ``VLLM_TARGET_DEVICE``; the PyPI (CUDA) wheel on a machine without CUDA resolves to
    ``UnspecifiedPlatform``. Resolution happens once, during ``import vllm``, and no module keeps its
    own reference (they import ``current_platform`` inside functions), so the CPU platform is set in
    its place. Later releases select CPU themselves and are left alone."""
    import vllm.platforms as platforms

    if not torch.cuda.is_available() and not platforms.current_platform.device_type:
        from vllm.platforms.cpu import CpuPlatform

        platforms._current_platform = CpuPlatform()


TINY_LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
    "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 256, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


@contextlib.contextmanager
def vllm_cpu_config(model_dir: Path) -> Iterator[object]:
    """A current ``VllmConfig`` and vLLM's model-parallel state (gloo, world size 1)."""
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    (model_dir / "config.json").write_text(json.dumps(TINY_LLAMA_CONFIG))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32")
    config = VllmConfig(model_config=model_config)
    with set_current_vllm_config(config):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=single_process_group("gloo"),
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        yield config


def _convert_weight_packed(weight: torch.Tensor) -> torch.Tensor:
    return weight.clone()




@contextlib.contextmanager
def cpu_fp8_ops() -> Iterator[None]:
    """vLLM's FP8 processing on CPU: the ``_C`` stand-ins and the block-kernel listing (module docstring)."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.triton import TritonFp8BlockScaledMMKernel
    from vllm.model_executor.layers.fused_moe.experts.triton_moe import TritonExperts
    from vllm.model_executor.layers.quantization.utils import quant_utils
    from vllm.platforms import current_platform

    library = torch.library.Library("_C", "FRAGMENT")
    added = []
    if not hasattr(torch.ops._C, "convert_weight_packed"):
        library.define("convert_weight_packed(Tensor weight) -> Tensor")
        library.impl("convert_weight_packed", _convert_weight_packed, "CompositeExplicitAutograd")
        added.append("convert_weight_packed")
    platform = current_platform._enum
    kernels = linear._POSSIBLE_FP8_BLOCK_KERNELS
    had_platform, previous = platform in kernels, kernels.get(platform)
    kernels[platform] = [TritonFp8BlockScaledMMKernel]
    supported = TritonFp8BlockScaledMMKernel.__dict__["is_supported"]
    TritonFp8BlockScaledMMKernel.is_supported = classmethod(lambda cls, compute_capability=None: (True, None))
    on_device = TritonExperts.__dict__["_supports_current_device"]
    schemes = TritonExperts.__dict__["_supports_quant_scheme"]
    TritonExperts._supports_current_device = staticmethod(lambda: True)
    # Upstream's list for a device with FP8 (CPU reports none): the three FP8 schemes Fp8MoEMethod asks for.
    fp8_schemes = {(quant_utils.kFp8StaticTensorSym, quant_utils.kFp8StaticTensorSym),
                   (quant_utils.kFp8StaticTensorSym, quant_utils.kFp8DynamicTensorSym),
                   (quant_utils.kFp8Static128BlockSym, quant_utils.kFp8Dynamic128Sym)}
    TritonExperts._supports_quant_scheme = staticmethod(
        lambda weight_key, activation_key: (weight_key, activation_key) in fp8_schemes
        or schemes.__func__(weight_key, activation_key)
    )
    try:
        with cpu_fp8_quant():
            yield
    finally:
        TritonExperts._supports_quant_scheme = schemes
        TritonExperts._supports_current_device = on_device
        TritonFp8BlockScaledMMKernel.is_supported = supported
        if had_platform:
            kernels[platform] = previous
        else:
            del kernels[platform]
        library._destroy()
        for name in added:  # torch.ops caches resolved overload packets
            torch.ops._C.__dict__.pop(name, None)


@contextlib.contextmanager
def cpu_dynamic_fp8_quant() -> Iterator[None]:
    """``torch.ops._C.dynamic_scaled_fp8_quant`` (per-tensor: scale = amax / 448) and the static op in torch
    where vLLM's build lacks them (``_cpu_stand_in.cpu_fp8_quant``, shared with the self-checks): vLLM 0.24's
    online FP8 methods quantise a bf16 weight with the dynamic op as the loader completes the layer."""
    with cpu_fp8_quant():
        yield

def _deep_gemm_modules() -> list[Any]:
    """The modules that bound vLLM's DeepGEMM decisions by name (``from vllm.utils.deep_gemm import ...``)."""
    names = (
        "vllm.utils.deep_gemm",
        "vllm.model_executor.layers.quantization.utils.fp8_utils",
        "vllm.model_executor.kernels.linear.scaled_mm.deep_gemm",
        "vllm.model_executor.layers.fused_moe.experts.deep_gemm_moe",
        "vllm.model_executor.layers.fused_moe.experts.triton_deep_gemm_moe",
    )
    return [importlib.import_module(name) for name in names]


def _scales_as_given(sf: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    """DeepGEMM's layout, stood in: the float32 block scales as vLLM hands them over."""
    return sf


def _packed_ue8m0_scales(sf: torch.Tensor, mn: int, k: int, recipe: tuple[int, int, int],
                         num_groups: int | None = None, is_sfa: bool = False, **kwargs: object) -> torch.Tensor:
    """DeepGEMM's layout, stood in with the shape and dtype it has on Blackwell: one scale per row (the
    block's, repeated), its UE8M0 exponent byte, four bytes along K packed into an int32, MN-major. Not
    DeepGEMM's bytes: a layout that differs from the checkpoint's in shape and dtype."""
    gran_mn = recipe[0] if is_sfa else recipe[1]
    rows = sf.float().repeat_interleave(gran_mn, dim=-2)[..., :mn, :].contiguous()
    exponents = (rows.view(torch.int32) >> 23).to(torch.uint8)
    exponents = torch.nn.functional.pad(exponents, (0, (-exponents.shape[-1]) % 4)).contiguous()
    packed = exponents.view(torch.int32)
    return packed.transpose(-1, -2).contiguous().transpose(-1, -2)


@contextlib.contextmanager
def cpu_deep_gemm_e8m0(packed: bool = False) -> Iterator[None]:
    """vLLM's DeepGEMM UE8M0 processing of block-FP8 layers, on CPU (use inside ``cpu_fp8_ops``).

    - vLLM's decision functions ``is_deep_gemm_supported`` and ``is_deep_gemm_e8m0_used`` answer True, where
      the modules that decide bound them (on a Hopper or Blackwell GPU with DeepGEMM both do, with
      ``VLLM_USE_DEEP_GEMM_E8M0`` at its default, on);
    - ``DeepGemmFp8BlockScaledMMKernel`` is the block-FP8 linear kernel listed for the CPU platform (upstream
      lists it for CUDA) and reports itself supported; the fused-MoE oracle picks its DEEPGEMM backend where
      ``VLLM_USE_DEEP_GEMM=1`` is set (the test sets it, as NeMo-RL does);
    - DeepGEMM's compiled ``transform_sf_into_required_layout`` (CUDA only) is stood in: the scales as
      given, or (``packed``) a Blackwell-shaped packed layout (:func:`_packed_ue8m0_scales`); and
      ``get_mk_alignment_for_contiguous_layout`` answers DeepGEMM's 128 (vLLM 0.29's MoE experts ask it as
      they are built; 0.33 finds its vendored DeepGEMM's answer on CPU).

    vLLM's UE8M0 requantisation (``requant_weight_ue8m0_inplace``: dequantise each 128 x 128 block, requantise
    it at a power-of-two scale), its E8M0 upcast and everything else of the processing run unchanged. Both
    sides of every comparison, patchkit's refit and vLLM's own first load, go through the same stand-ins;
    all are removed on exit."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.deep_gemm import DeepGemmFp8BlockScaledMMKernel
    from vllm.platforms import current_platform

    saved: list[tuple[Any, str, Any]] = []

    def put(owner: Any, name: str, value: Any) -> None:
        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, value)

    for module in _deep_gemm_modules():
        for name in ("is_deep_gemm_supported", "is_deep_gemm_e8m0_used"):
            if name in module.__dict__:
                put(module, name, lambda: True)
        if "get_mk_alignment_for_contiguous_layout" in module.__dict__:
            put(module, "get_mk_alignment_for_contiguous_layout", lambda: [128, 128])
    put(importlib.import_module("vllm.model_executor.layers.quantization.utils.fp8_utils"),
        "transform_sf_into_required_layout", _packed_ue8m0_scales if packed else _scales_as_given)
    put(DeepGemmFp8BlockScaledMMKernel, "is_supported", classmethod(lambda cls, compute_capability=None: (True, None)))
    kernels = linear._POSSIBLE_FP8_BLOCK_KERNELS
    platform = current_platform._enum
    previous = kernels[platform]
    kernels[platform] = [DeepGemmFp8BlockScaledMMKernel]
    try:
        yield
    finally:
        kernels[platform] = previous
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


# The NVFP4 emulation and Marlin-layout redirects are shipped (the vLLM self-checks use them): one copy.
from patchkit.patches.vllm._checks._cpu_stand_in import (  # noqa: E402,F401
    cpu_activation_op,
    cpu_fp8_quant,
    cpu_marlin_layout,
    cpu_nvfp4_kernels,
    single_process_group,
)
