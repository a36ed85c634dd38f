"""Self-checks of the vLLM patches, built from vLLM's own ModelOpt NVFP4 linear layers.

``check_nvfp4_refit`` (``vllm.nvfp4_refit``): an export -> refit round trip.
``check_nvfp4_marlin_w4a16`` (``vllm.nvfp4_marlin_w4a16``): an NVFP4 checkpoint served as W4A16 on Marlin.
``check_fp8_refit`` (``vllm.fp8_refit``): two FP8 checkpoints refitted into vLLM's FP8 linear layers.

Run by ``patchkit doctor`` (see :mod:`patchkit.selfcheck`) and by ``tests/vllm``. Two vLLM
``ColumnParallelLinear``/``RowParallelLinear`` layers with ``ModelOptNvFp4Config`` are loaded through
vLLM's ``AutoWeightsLoader`` and processed by upstream's ``process_weights_after_loading``; float
weights are then exported to the NVFP4 checkpoint format (as a QAT export writes it) and refitted
through ``patchkit.patches.vllm.refit``. The layers must serve exactly the exported weights (against a
dequantiser that does not use vLLM), keep their kernel tensors (same objects and storage, which
CUDA graphs and the engine hold), and serve the first weights again after a second refit. On CPU,
vLLM's own NVFP4 emulation kernel runs (``_cpu_stand_in``).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from patchkit.selfcheck import CheckContext, NeedsGPU, SelfCheckFailed, expect

from .._nvfp4_checkpoint import (
    DOWN,
    UP,
    Bf16Linears,
    TwoLinears,
    dequantize,
    exact_activations,
    export_nvfp4,
    items,
    kernel_name,
    linear_checkpoint,
    linear_reference,
    process_weights_after_loading,
    weights_a,
)
from .._nvfp4_marlin_w4a16_impl import as_checkpoint_says

IN_FEATURES = {UP: 64, DOWN: 32}


def exported_weights(seed: int = 11) -> dict[str, torch.Tensor]:
    """Float weights of both layers (four decades of magnitude), exported to NVFP4 checkpoint tensors."""
    generator = torch.Generator().manual_seed(seed)
    up = torch.randn(32, 64, generator=generator) * torch.logspace(-2, 0, 64)
    down = torch.randn(64, 32, generator=generator) * 0.05
    return {**export_nvfp4(UP, up), **export_nvfp4(DOWN, down)}


def _largest_error(model: TwoLinears, weights: dict[str, torch.Tensor], device: str) -> float:
    worst = 0.0
    for name, in_features in IN_FEATURES.items():
        x = exact_activations(5, in_features)
        out, _ = getattr(model, name)(x.to(device))
        worst = max(worst, float((out.float().cpu() - linear_reference(weights, name, x)).abs().max()))
    return worst


def _kernel_tensors(model: TwoLinears) -> dict[str, tuple[int, int]]:
    return {f"{layer}.{name}": (id(p), p.data_ptr()) for layer in IN_FEATURES
            for name, p in getattr(model, layer).named_parameters()}


def check_nvfp4_refit(context: CheckContext) -> None:
    """Load, refit with exported weights, refit back: each time the layers serve exactly the weights given."""
    from ..refit import refit
    from ._cpu_stand_in import vllm_context

    first, exported = weights_a(), exported_weights()  # on the CPU, from CPU generators
    with vllm_context(context.device):
        # W4A4 layers, as the checkpoint says, even where vllm.nvfp4_marlin_w4a16 is on in this process.
        with torch.device(context.device), as_checkpoint_says():  # the device: where vLLM's loader builds layers
            model: Any = TwoLinears()
        model.load_weights(items(first))
        process_weights_after_loading(model)
        error = _largest_error(model, first, context.device)
        expect(error <= 1e-4, "the first load serves the checkpoint's weights (largest output difference)",
               "<= 1e-4", f"{error:.3g}")
        kernel_before = _kernel_tensors(model)
        for step, weights in (("refit with exported weights", exported), ("refit back", first)):
            try:
                with refit(model):
                    model.load_weights(items(weights))
            except Exception as exc:
                raise SelfCheckFailed(f"{step} of vLLM's NVFP4 linear layers", "the layers take the new weights",
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                                      ) from exc
            error = _largest_error(model, weights, context.device)
            expect(error <= 1e-4, f"after the {step} the layers serve the new weights (largest output difference "
                   "from the reference dequantiser)", "<= 1e-4", f"{error:.3g}")
            moved = sorted(k for k, v in _kernel_tensors(model).items() if kernel_before.get(k) != v)
            expect(not moved, f"the {step} keeps every kernel tensor (same object, same storage)", "none replaced",
                   moved)


MARLIN = "MarlinNvFp4LinearKernel"


def check_nvfp4_marlin_w4a16(context: CheckContext) -> None:
    """Layers of an NVFP4 (W4A4) checkpoint run vLLM's W4A16 Marlin kernel and load the W4A4-shaped checkpoint.

    Built as vLLM builds them from ``hf_quant_config`` ``quant_algo: NVFP4``. On CPU, Marlin's CUDA
    repack is stood in (``_cpu_stand_in.cpu_marlin_layout``) and no Marlin forward can run; on CUDA
    the layers' output must also equal the W4A16 product (bf16 activations times the dequantised
    weight), which activation quantisation (W4A4) would not give.
    """
    from ._cpu_stand_in import cpu_marlin_layout, vllm_context

    device = context.device
    # A W4A4 checkpoint: with activation scales, which W4A16 loads and then drops.
    weights = {**linear_checkpoint(UP, seed=1, out_features=64, in_features=128, weight_scale_2=0.01, input_scale=1.0),
               **linear_checkpoint(DOWN, seed=2, out_features=128, in_features=64, weight_scale_2=0.02,
                                   input_scale=1.0)}
    with vllm_context(device), cpu_marlin_layout() if device == "cpu" else contextlib.nullcontext():
        with torch.device(device):
            model: Any = Bf16Linears("NVFP4")
        kernels = {name: kernel_name(getattr(model, name)) for name in (UP, DOWN)}
        expect(kernels == dict.fromkeys(kernels, MARLIN), "layers of an NVFP4 (W4A4) checkpoint run vLLM's W4A16 "
               "Marlin kernel (16-bit activations)", dict.fromkeys(kernels, MARLIN), kernels)
        try:
            model.load_weights(items({k: v.to(device) for k, v in weights.items()}))
            process_weights_after_loading(model)
        except Exception as exc:
            found = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            raise SelfCheckFailed("the W4A16 layers load and process an NVFP4 checkpoint with activation scales",
                                  "loaded", found) from exc
        if device != "cuda":
            return
        for name, in_features in ((UP, 128), (DOWN, 64)):
            x = torch.randn(8, in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
            w = dequantize(*(weights[f"{name}.{part}"] for part in ("weight", "weight_scale", "weight_scale_2")))
            reference = x.float() @ w.T
            out = getattr(model, name)(x.to(device))[0].float().cpu()
            error = float((out - reference).abs().max() / reference.abs().max())
            expect(error <= 2e-2, f"{name} serves the W4A16 product (largest difference relative to the largest "
                   "output; bf16 rounding)", "<= 2e-2", f"{error:.3g}")


# --- vllm.serve_signals_main_thread ---


#: A one-layer Llama ``config.json``: a model folder for vLLM's argument handling (no weights read).
TINY_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 256,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
}


class EngineStartReached(Exception):
    """Raised where ``run_headless`` goes on to start engine processes: the drivers stop there."""


class _StopAtEngineStart:
    """The engine config's ``parallel_config`` as far as ``run_headless`` reads it before the engines
    start: one local engine; reading ``node_rank_within_dp`` (the line after the signal handlers, in
    0.24-0.33) ends the run."""

    data_parallel_size_local = 1

    @property
    def node_rank_within_dp(self) -> int:
        raise EngineStartReached


def run_headless_in_a_thread(context_device: str = "cpu") -> dict[str, Any]:
    """Run vLLM's own ``run_headless`` in a fresh thread, as verl starts it in a Ray actor, up to where it
    would start the engine processes; what happened: ``error`` (None when the run reached the engine
    start) and the process's SIGTERM/SIGINT handlers ``before`` and ``after``.

    ``args`` come from vLLM's own ``serve`` parser (``--headless``) and ``AsyncEngineArgs.from_cli_args``;
    only ``create_engine_config`` (model and device resolution) is stood in, by a config of one local
    engine that ends the run where engine processes would start.
    """
    import signal
    import threading
    from types import SimpleNamespace
    from unittest import mock

    import vllm
    from vllm.entrypoints.cli import serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ._cpu_stand_in import cpu_platform

    watched = (signal.SIGTERM, signal.SIGINT)
    outcome: dict[str, Any] = {"error": None, "before": {s: signal.getsignal(s) for s in watched}}
    # A local model folder for the whole run: vLLM's argument handling looks a model name up on the Hub.
    with tempfile.TemporaryDirectory(prefix="patchkit-headless-") as model_dir:
        (Path(model_dir) / "config.json").write_text(json.dumps(TINY_MODEL_CONFIG))
        with cpu_platform() if context_device == "cpu" else contextlib.nullcontext():
            args = serve.make_arg_parser(FlexibleArgumentParser()).parse_args(["--headless", "--model", model_dir])
        args.api_server_count = 0  # what verl sets before run_headless
        config = SimpleNamespace(parallel_config=_StopAtEngineStart())

        def run() -> None:
            try:
                serve.run_headless(args)
            except EngineStartReached:
                pass
            except BaseException as exc:  # the thread's error is the finding
                outcome["error"] = exc

        with mock.patch.object(vllm.AsyncEngineArgs, "create_engine_config", lambda self, **kwargs: config):
            worker = threading.Thread(target=run, name="patchkit-headless-check")
            worker.start()
            worker.join()
    outcome["after"] = {s: signal.getsignal(s) for s in watched}
    return outcome


def check_serve_signals_main_thread(context: CheckContext) -> None:
    """vLLM's ``run_headless`` started in a worker thread gets to its engine start; the process's handlers stay."""
    outcome = run_headless_in_a_thread(context.device)
    error = outcome["error"]
    expect(error is None, "vLLM's run_headless started in a worker thread reaches the engine start",
           "no error", f"{type(error).__name__}: {error}" if error is not None else None)
    expect(outcome["before"] == outcome["after"], "the process's SIGTERM/SIGINT handlers after it", "unchanged",
           f"{outcome['before']} -> {outcome['after']}")


# --- vllm.moe_expert_weight_loaders (native) ---


def processed_tiny_moe(context_device: str, quantized: bool = True) -> Any:
    """vLLM's fused-MoE layer built, loaded and processed by vLLM's own code (see ``_tiny_moe``)."""
    from .._nvfp4_checkpoint import process_weights_after_loading
    from ._cpu_stand_in import vllm_context
    from ._tiny_moe import TinyMoE, checkpoint

    with vllm_context(context_device), torch.device(context_device):
        model = TinyMoE(quantized)
        model.load_weights({k: v.to(context_device) for k, v in checkpoint(quantized, seed=0).items()})
        process_weights_after_loading(model)
    return model


def check_moe_expert_weight_loaders(context: CheckContext) -> None:
    """After vLLM's processing every fused-MoE expert parameter still has the routed layer's ``weight_loader``."""
    from ._tiny_moe import is_the_layers_loader, loaders_of

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


# --- vllm.fp8_refit ---


@contextlib.contextmanager
def _model_dtype(dtype: torch.dtype) -> Any:
    """What ``Fp8LinearMethod.__init__`` reads of the model config (its dtype), where the check's vLLM
    config has no ``ModelConfig`` (building one resolves a Hugging Face config: a minute on a busy CPU)."""
    from types import SimpleNamespace

    from vllm.config import get_current_vllm_config

    config = get_current_vllm_config()
    if config.model_config is not None:
        yield
        return
    object.__setattr__(config, "model_config", SimpleNamespace(dtype=dtype))
    try:
        yield
    finally:
        object.__setattr__(config, "model_config", None)


def check_fp8_refit(context: CheckContext) -> None:
    """Load one FP8 checkpoint, refit another, refit back: each time the layers' kernel tensors hold exactly
    that checkpoint (read without vLLM), in the same tensor objects and storage."""
    from ..refit import refit
    from ._cpu_stand_in import vllm_context
    from ._fp8_checkpoint import Fp8TwoLinears, checkpoint, mismatches

    first, second = checkpoint(seed=1), checkpoint(seed=2)
    with vllm_context(context.device):
        try:
            with torch.device(context.device), _model_dtype(torch.float32):
                model: Any = Fp8TwoLinears()
        except (KeyError, ValueError) as exc:  # vLLM's FP8 kernel table has no kernel for this platform
            raise NeedsGPU(f"vLLM selects no FP8 linear kernel here ({str(exc)[:120]}); on vLLM 0.24's PyPI wheel "
                           "without CUDA, the CPU platform must be selected before vLLM is imported") from exc
        model.load_weights(items(first))
        process_weights_after_loading(model)
        wrong = mismatches(model, first)
        expect(not wrong, "vLLM's first load of an FP8 checkpoint serves it (kernel tensors)", "all of it", wrong)
        kernel_before = {name: (id(p), p.data_ptr()) for name, p in model.named_parameters()}
        for step, weights in (("refit with a second checkpoint", second), ("refit back", first)):
            try:
                with refit(model):
                    model.load_weights(items(weights))
            except Exception as exc:
                raise SelfCheckFailed(f"{step} of vLLM's FP8 linear layers", "the layers take the new weights",
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                                      ) from exc
            wrong = mismatches(model, weights)
            expect(not wrong, f"after the {step} the kernel tensors hold that checkpoint", "all of it", wrong)
            moved = sorted(k for k, v in {n: (id(p), p.data_ptr()) for n, p in model.named_parameters()}.items()
                           if kernel_before.get(k) != v)
            expect(not moved, f"the {step} keeps every kernel tensor (same object, same storage)", "none replaced",
                   moved)
