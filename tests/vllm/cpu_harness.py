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
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}",
            backend="gloo",
        )
        initialize_model_parallel(1, 1)
        yield config


@contextlib.contextmanager
def cpu_nvfp4_kernels() -> Iterator[None]:
    """Register vLLM's NVFP4 emulation kernels for the CPU platform (see module docstring)."""
    from vllm.model_executor.kernels import linear as linear_kernels
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.model_executor.layers.fused_moe.experts.nvfp4_emulation_moe import (
        Nvfp4QuantizationEmulationTritonExperts as EmulationExperts,
    )
    from vllm.platforms import current_platform

    table = linear_kernels._POSSIBLE_NVFP4_KERNELS
    platform = current_platform._enum
    saved_linear = table.get(platform)
    saved_device_check = EmulationExperts.__dict__.get("_supports_current_device")
    table[platform] = [EmulationNvFp4LinearKernel]
    EmulationExperts._supports_current_device = staticmethod(lambda: True)
    try:
        yield
    finally:
        if saved_linear is None:
            table.pop(platform, None)
        else:
            table[platform] = saved_linear
        if saved_device_check is None:
            del EmulationExperts._supports_current_device
        else:
            EmulationExperts._supports_current_device = saved_device_check


@contextlib.contextmanager
def cpu_marlin_layout() -> Iterator[None]:
    """W4A16 (Marlin) NVFP4 linear layers buildable and processable on CPU (see module docstring)."""
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
