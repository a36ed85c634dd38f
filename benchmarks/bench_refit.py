"""Refit of a stack of vLLM ModelOpt NVFP4 layers against vLLM's own first load of the same weights.

Run in a vLLM environment (compat_matrix.yaml ``vllm-0.24`` / ``vllm-0.33``), from the repository root::

    VLLM_TARGET_DEVICE=cpu python benchmarks/bench_refit.py [--layers 8] [--hidden 2048] [--repeat 5]

Both sides run in one process on the same tensors, interleaved, median of ``--repeat``, in wall time
and in CPU time of the process (``ratio``, ``cpu_ratio``):

- **first load**: a freshly built model (vLLM's ``create_weights``, not timed), then what vLLM's
  loader does with a checkpoint: ``model.load_weights(weights)`` and ``process_weights_after_loading``
  of every layer;
- **refit**: ``refit_weights(model, weights)`` on a model that was started with
  ``load_format="dummy"`` (what verl and NeMo-RL do), alternating two checkpoints.

It also checks that refits reallocate no kernel tensor: every parameter and buffer of every layer
keeps its data pointer (what CUDA graphs captured). The layers are W4A4 NVFP4 dense linears
(``ColumnParallelLinear``, vLLM's emulation kernel on CPU) and one fused-MoE layer (EMULATION
backend); the CPU harness of ``tests/vllm/conftest.py`` is reused for kernel registration.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

TESTS = Path(__file__).resolve().parent.parent / "tests" / "vllm"
sys.path.insert(0, str(TESTS))


def build(layers: int, hidden: int, experts: int) -> torch.nn.Module:
    from moe_helpers import MoEModel
    from vllm.model_executor.layers.linear import ColumnParallelLinear
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
    from vllm.model_executor.models.utils import AutoWeightsLoader

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            quant_config = ModelOptNvFp4Config("NVFP4", True, None, [], 16)
            self.layers = torch.nn.ModuleList(
                ColumnParallelLinear(hidden, hidden, bias=False, quant_config=quant_config, prefix=f"layers.{i}",
                                     params_dtype=torch.bfloat16)
                for i in range(layers)
            )
            if experts:
                self.moe = MoEModel(experts, hidden, hidden // 2, params_dtype=torch.bfloat16)

        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights)

    return Stack()


def checkpoint(layers: int, hidden: int, experts: int, seed: int) -> list[tuple[str, torch.Tensor]]:
    import moe_helpers
    from nvfp4_helpers import linear_checkpoint

    weights: dict[str, torch.Tensor] = {}
    for i in range(layers):
        weights.update(linear_checkpoint(f"layers.{i}", seed=seed * 1000 + i, out_features=hidden,
                                         in_features=hidden, weight_scale_2=0.01, input_scale=1.0))
    if experts:
        moe = moe_helpers.checkpoint(seed, 0.01, 1.0, experts=experts, hidden=hidden, intermediate=hidden // 2)
        weights.update({f"moe.{n}": t for n, t in moe.items()})
    return list(weights.items())


def pointers(model: torch.nn.Module) -> dict[str, int]:
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {name: t.data_ptr() for name, t in tensors.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="torch intra-op threads (0: torch's default). On a shared machine with few cores, 1 avoids"
                             " OpenMP threads spinning against other jobs, which swings wall times by 10x")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile the refits, print the top functions")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import cpu_harness

    cpu_harness.select_cpu_platform()
    with tempfile.TemporaryDirectory() as tmp, cpu_harness.vllm_cpu_config(Path(tmp)) as config, \
            cpu_harness.cpu_nvfp4_kernels():
        run(args, config)


def run(args: argparse.Namespace, config: Any) -> None:
    import vllm
    import vllm.model_executor.layers.quantization.modelopt  # noqa: F401  (so the patch installs now)
    from nvfp4_helpers import process_weights_after_loading
    from patchkit.patches.vllm.refit import refit_weights
    from vllm.config import LoadConfig
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    import patchkit

    (record,) = patchkit.apply("vllm.nvfp4_refit")
    assert record.state.installed, record.to_dict()
    payloads = [checkpoint(args.layers, args.hidden, args.experts, seed) for seed in (1, 2)]

    model = build(args.layers, args.hidden, args.experts)
    DummyModelLoader(LoadConfig(load_format="dummy")).load_weights(model, config.model_config)
    process_weights_after_loading(model)
    before = pointers(model)
    refit_weights(model, payloads[1])  # warm-up (first-call imports)

    import cProfile

    profiler = cProfile.Profile() if args.profile else None
    load_times, refit_times, load_cpu, refit_cpu = [], [], [], []
    for i in range(args.repeat):
        payload = payloads[i % 2]
        fresh = build(args.layers, args.hidden, args.experts)
        start, start_cpu = time.perf_counter(), time.process_time()
        fresh.load_weights(payload)
        process_weights_after_loading(fresh)
        load_times.append(time.perf_counter() - start)
        load_cpu.append(time.process_time() - start_cpu)
        del fresh

        start, start_cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        refit_weights(model, payload)
        if profiler is not None:
            profiler.disable()
        refit_times.append(time.perf_counter() - start)
        refit_cpu.append(time.process_time() - start_cpu)

    if profiler is not None:
        import pstats

        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    moved = sorted(name for name, ptr in pointers(model).items() if before.get(name) != ptr)
    load, refit = statistics.median(load_times), statistics.median(refit_times)
    result = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "layers": args.layers,
        "hidden": args.hidden,
        "experts": args.experts,
        "checkpoint_mb": round(sum(t.numel() * t.element_size() for _, t in payloads[0]) / 2**20, 1),
        "first_load_s": round(load, 4),
        "refit_s": round(refit, 4),
        "ratio": round(refit / load, 3),
        # CPU time of this process (all its threads): less sensitive to other jobs on a shared machine
        "first_load_cpu_s": round(statistics.median(load_cpu), 4),
        "refit_cpu_s": round(statistics.median(refit_cpu), 4),
        "cpu_ratio": round(statistics.median(refit_cpu) / statistics.median(load_cpu), 3),
        "torch_threads": torch.get_num_threads(),
        "kernel_tensors": len(before),
        "reallocated": moved,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>15}: {value}")
    if moved:
        raise SystemExit(f"refit reallocated {len(moved)} kernel tensors: {moved}")


if __name__ == "__main__":
    main()
