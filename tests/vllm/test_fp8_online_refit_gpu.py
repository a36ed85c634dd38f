"""Online FP8 (``vllm.fp8_online_refit``, ``vllm.fp8_online_moe_refit``) on vLLM's real CUDA kernels, with a
CUDA graph captured before the refits.

Run with ``pytest -m gpu tests/vllm`` on a CUDA machine with vLLM's compiled kernels (skipped elsewhere).
The CPU tests (``test_fp8_online_refit.py``) stand in for vLLM's quantisation op and run its Triton experts;
here nothing is replaced: vLLM quantises the bf16 weights with its own CUDA op (``scaled_fp8_quant``) and
serves them with the FP8 GEMM and the fused-MoE backend it picks for this GPU, named in the log with the
CUDA kernels the forward launched. The layers are ``_checks._fp8_online``'s (a fused ``gate_up`` and a
``down`` linear; a 4-expert fused-MoE layer), under each online-FP8 config the release has (``Fp8Config``
without an FP8-serialised checkpoint, ``OnlineQuantizationConfig`` with ``fp8_per_tensor``), built as vLLM
builds a bf16 model (the model config's dtype bf16: the online linear methods read their input dtype from
it). ``gpu_kernels.refits_under_a_captured_graph`` drives it: a dummy start, a CUDA graph captured, refits
of two bf16 checkpoints alternating; after each, every kernel tensor (FP8 weights, float32 scales) at its
address and equal bit for bit to vLLM's own first load of the same bf16 weights into a fresh model, and the
graph's replay equal bit for bit to an eager forward and to the fresh model's; a wrong shape raises
``RefitError`` and the graph serves the old weights.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import torch
from gpu_kernels import GPU, cuda_kernels_run, forward_of, quant_method_in_use, refits_under_a_captured_graph
from patchkit.patches.vllm.refit._checks._fp8_online import (
    CHECKPOINTS,
    EXPERTS,
    HIDDEN,
    INTERMEDIATE,
    MODELS,
    config_kinds,
)

import patchkit

pytestmark = GPU

logger = logging.getLogger(__name__)

#: both online-FP8 refit patches: which one records a layer depends on the release and the config
PATCHES = ("vllm.fp8_online_refit", "vllm.fp8_online_moe_refit")


@contextlib.contextmanager
def online_fp8_refit_patches() -> Iterator[None]:
    """The online-FP8 refit patches that have a variant for this vLLM, applied (reverted on exit)."""
    import vllm.model_executor.layers.quantization.fp8  # noqa: F401  (each patch installs now, not later)
    import vllm.model_executor.layers.quantization.online.fp8  # noqa: F401

    with patchkit.applied(*PATCHES) as records:
        states = {record.id: record.state.value for record in records}
        assert states["vllm.fp8_online_refit"] == "applied", states
        assert states["vllm.fp8_online_moe_refit"] in ("applied", "skipped"), states  # 0.24 only
        yield


@pytest.fixture
def bf16_model(vllm_config: object, monkeypatch: pytest.MonkeyPatch) -> object:
    """The shared vLLM config serving a bf16 model, as an RL framework's online-FP8 rollout does."""
    monkeypatch.setattr(vllm_config.model_config, "dtype", torch.bfloat16)  # type: ignore[attr-defined]
    return vllm_config


@pytest.mark.parametrize("config", ["fp8", "online"])
@pytest.mark.parametrize("kind", ["linear", "moe"])
def test_online_fp8_refits_on_vllms_kernels_equal_its_first_load_under_a_captured_graph(
        bf16_model: object, kind: str, config: str) -> None:
    if config not in config_kinds():
        pytest.skip("this vLLM's Fp8Config quantises no bf16 checkpoint (OnlineQuantizationConfig does)")
    states = [CHECKPOINTS[kind](seed=seed) for seed in (1, 2)]
    with online_fp8_refit_patches():
        forward = forward_of(kind, bf16_model, hidden=HIDDEN, down_features=INTERMEDIATE, experts=EXPERTS)
        model = refits_under_a_captured_graph(lambda: MODELS[kind](config), states, forward, bf16_model)
        assert any(t.dtype == torch.float8_e4m3fn for t in model.parameters()), "vLLM quantised nothing"
        logger.info("online fp8 %s (%s config): %s; CUDA kernels: %s", kind, config, quant_method_in_use(model),
                    ", ".join(cuda_kernels_run(lambda: forward(model))))
