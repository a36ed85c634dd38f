"""Every refit format's test model and checkpoint, in one table, for the tests that hold for every format.

One :class:`FormatCase` per (format, layer type): the patches that record it, what vLLM needs on CPU
to build and process it (``environment``: a conftest fixture or a context manager of the self-checks),
the model (vLLM's own layers with the format's config) and a checkpoint of it, in a model's names:
fused linears as ``gate.*``/``up.*``/``down.*`` shards, MoE experts as ``experts.<e>.<proj>.*``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch
from vllm_fixtures import installed


@dataclass(frozen=True)
class FormatCase:
    patches: Callable[[], tuple[str, ...]]
    #: conftest fixtures to request, then a context manager to enter, before the model is built
    fixtures: tuple[str, ...]
    environment: Callable[[], contextlib.AbstractContextManager[object]] | None
    model: Callable[[], torch.nn.Module]
    checkpoint: Callable[[int], dict[str, torch.Tensor]]
    moe: bool


def _fp8(kind: str, block: bool) -> FormatCase:
    from fp8_helpers import Fp8Linears, Fp8Moe, linear_checkpoint, moe_checkpoint

    moe = kind == "moe"
    return FormatCase(
        lambda: ("vllm.fp8_refit",), ("cpu_fp8_ops",), None,
        (lambda: Fp8Moe(block)) if moe else (lambda: Fp8Linears(block)),
        (lambda seed: moe_checkpoint(block, seed)) if moe else (lambda seed: linear_checkpoint(block, seed)),
        moe,
    )


def _fp8_e8m0(kind: str, e8m0_checkpoint: bool) -> FormatCase:
    """Block FP8 with E8M0 scales: from the checkpoint (``is_scale_e8m0``) or from vLLM's DeepGEMM UE8M0
    processing of float32 ones (the harness forces vLLM's DeepGEMM decisions on CPU)."""
    from fp8_helpers import (
        Fp8Linears,
        Fp8Moe,
        bf16_model,
        deep_gemm_ue8m0,
        linear_checkpoint,
        moe_checkpoint,
        with_e8m0_scales,
    )

    moe = kind == "moe"

    def model() -> torch.nn.Module:
        with bf16_model():
            return Fp8Moe(True) if moe else Fp8Linears(True, e8m0_scales=e8m0_checkpoint)

    def checkpoint(seed: int) -> dict[str, torch.Tensor]:
        tensors = moe_checkpoint(True, seed) if moe else linear_checkpoint(True, seed)
        return with_e8m0_scales(tensors) if e8m0_checkpoint else tensors

    return FormatCase(lambda: ("vllm.fp8_refit",), ("cpu_fp8_ops",),
                      None if e8m0_checkpoint else deep_gemm_ue8m0, model, checkpoint, moe)


def _fp8_online(kind: str) -> FormatCase:
    from patchkit.patches.vllm.refit._checks._fp8_online import (
        OnlineFp8Linears,
        OnlineFp8Moe,
        linear_checkpoint,
        moe_checkpoint,
    )

    moe = kind == "moe"
    return FormatCase(
        lambda: ("vllm.fp8_online_refit",), ("cpu_fp8_ops", "cpu_dynamic_fp8_quant"), None,
        OnlineFp8Moe if moe else OnlineFp8Linears,  # OnlineQuantizationConfig: the online.fp8 classes
        moe_checkpoint if moe else linear_checkpoint,
        moe,
    )


def _ct(kind: str) -> FormatCase:
    from patchkit.patches.vllm.refit._checks._ct_nvfp4_checkpoint import (
        CtLinears,
        CtMoe,
        linear_checkpoint,
        moe_checkpoint,
    )

    moe = kind == "moe"
    return FormatCase(
        lambda: ("vllm.compressed_tensors_nvfp4_refit", "vllm.compressed_tensors_nvfp4_moe_refit"),
        ("cpu_nvfp4_kernels",), None,
        (lambda: CtMoe(a16=False)) if moe else (lambda: CtLinears(a16=False)),
        (lambda seed: moe_checkpoint(False, seed)) if moe else (lambda seed: linear_checkpoint(False, seed)),
        moe,
    )


def _modelopt_nvfp4_linears() -> torch.nn.Module:
    from patchkit.patches.vllm._checks._gate_up_down import GateUpDown
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    return GateUpDown(ModelOptNvFp4Config("NVFP4", True, None, [], 16), hidden=64, intermediate=32)


def _modelopt_nvfp4_linear_checkpoint(seed: int) -> dict[str, torch.Tensor]:
    from nvfp4_helpers import linear_checkpoint

    return {
        **linear_checkpoint("gate", seed, 32, 64, weight_scale_2=0.01, input_scale=0.5),
        **linear_checkpoint("up", seed + 1, 32, 64, weight_scale_2=0.01, input_scale=0.5),
        **linear_checkpoint("down", seed + 2, 64, 32, weight_scale_2=0.02, input_scale=0.5),
    }


def _modelopt_nvfp4(kind: str) -> FormatCase:
    from moe_helpers import MoEModel, checkpoint

    moe = kind == "moe"
    return FormatCase(
        lambda: ("vllm.nvfp4_refit",), ("cpu_nvfp4_kernels",), None,
        MoEModel if moe else _modelopt_nvfp4_linears,
        (lambda seed: checkpoint(seed, weight_scale_2=0.01, input_scale=1.0)) if moe
        else _modelopt_nvfp4_linear_checkpoint,
        moe,
    )


def _mxfp8(kind: str) -> FormatCase:
    from patchkit.patches.vllm.refit._checks._mxfp8 import MODELS, checkpoint, emulation_backends, has_linear_method

    return FormatCase(
        lambda: ("vllm.mxfp8_refit",) if has_linear_method() else ("vllm.mxfp8_refit", "vllm.nvfp4_refit"),
        ("vllm_config",), lambda: emulation_backends("cpu"),
        MODELS[kind], lambda seed: checkpoint(kind, seed), kind == "moe",
    )


def _mxfp4() -> FormatCase:
    from patchkit.patches.vllm.refit._checks._mxfp4_moe import Mxfp4Moe, checkpoint, marlin_backend

    return FormatCase(
        lambda: ("vllm.mxfp4_moe_refit",), ("vllm_config",), lambda: marlin_backend("cpu"),
        lambda: Mxfp4Moe("mxfp4"), lambda seed: checkpoint("mxfp4", seed), True,
    )


#: every format and layer type a refit takes, by test id
FORMATS: dict[str, Callable[[], FormatCase]] = {
    "fp8-linear": lambda: _fp8("linear", False),
    "fp8-linear-block": lambda: _fp8("linear", True),
    "fp8-moe": lambda: _fp8("moe", False),
    "fp8-moe-block": lambda: _fp8("moe", True),
    "fp8-linear-block-e8m0-checkpoint": lambda: _fp8_e8m0("linear", e8m0_checkpoint=True),
    "fp8-linear-block-ue8m0-deepgemm": lambda: _fp8_e8m0("linear", e8m0_checkpoint=False),
    "fp8-moe-block-ue8m0-deepgemm": lambda: _fp8_e8m0("moe", e8m0_checkpoint=False),
    "fp8-online-linear": lambda: _fp8_online("linear"),
    "fp8-online-moe": lambda: _fp8_online("moe"),
    "ct-nvfp4-linear": lambda: _ct("linear"),
    "ct-nvfp4-moe": lambda: _ct("moe"),
    "modelopt-nvfp4-linear": lambda: _modelopt_nvfp4("linear"),
    "modelopt-nvfp4-moe": lambda: _modelopt_nvfp4("moe"),
    "mxfp8-linear": lambda: _mxfp8("linear"),
    "mxfp8-moe": lambda: _mxfp8("moe"),
    "mxfp4-moe": _mxfp4,
}


@contextlib.contextmanager
def format_started(request: pytest.FixtureRequest, fmt: str) -> Iterator[tuple[FormatCase, torch.nn.Module]]:
    """The format's patches applied and its model built and started as RL frameworks start vLLM
    (``load_format="dummy"``), for the ``with`` block; the patches are reverted after."""
    from nvfp4_helpers import dummy_started

    case = FORMATS[fmt]()
    for fixture in case.fixtures:
        request.getfixturevalue(fixture)
    vllm_config = request.getfixturevalue("vllm_config")
    with contextlib.ExitStack() as stack:
        if case.environment is not None:
            stack.enter_context(case.environment())
        stack.enter_context(installed(*case.patches()))
        yield case, dummy_started(case.model(), vllm_config)
