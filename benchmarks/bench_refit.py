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

Between iterations the discarded fresh model is garbage-collected (not timed): vLLM's layers hold
their weight loaders as bound methods, a reference cycle, so without a collection every fresh model's
memory stays allocated and the next one takes new pages. The minor page faults of each side are
reported (``first_load_faults``, ``refit_faults``, Linux): on CPU, first-touch faults on freshly
allocated memory cost about 2 us per 4 KiB page and land on whichever side glibc gives new pages to
(the split changes from run to run), which makes CPU ratios swing; a GPU's caching allocator pays
none. ``--device cuda`` builds the layers on the GPU and feeds both sides GPU tensors (the colocated
refit), synchronising before each clock read; it also times a first load from host tensors
(``first_load_from_host_s``), which is how vLLM's loader reads a checkpoint. vLLM must import there
without its CUDA extensions (a build marked ``+cpu``), so its platform is CPU and the layers use the
emulation kernels and backends of ``tests/vllm/vllm_cpu_harness.py``; both sides run the same loaders and
processing on the GPU tensors. How the H200 figures of docs/benchmarks.md were made: vLLM 0.24's Python files
(its ``site-packages/vllm`` without ``*.so``, and the packages it imports that the machine lacks)
were unpacked on the GPU machine with ``+cpu`` added to the version in ``vllm/_version.py`` and in
its dist-info ``METADATA``, then ``VLLM_TARGET_DEVICE=cpu python benchmarks/bench_refit.py --device
cuda --threads 1 --repeat 15``.

It also checks that refits reallocate no kernel tensor: every parameter and buffer of every layer
keeps its data pointer (what CUDA graphs captured). The layers are W4A4 NVFP4 dense linears
(``ColumnParallelLinear``, vLLM's emulation kernel on CPU) and one fused-MoE layer (EMULATION
backend); the CPU harness of ``tests/vllm/conftest.py`` is reused for kernel registration.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import resource
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


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the layers and the refit tensors live (cuda: see the module docstring)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile the refits, print the top functions")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    import vllm_cpu_harness as cpu_harness

    cpu_harness.select_cpu_platform()
    from vllm.platforms import current_platform

    # With vLLM's CUDA kernels present, both sides use what vLLM picks (Marlin on Hopper); the
    # emulation stand-ins are for a vLLM without them.
    kernels = contextlib.nullcontext() if current_platform.is_cuda() else cpu_harness.cpu_nvfp4_kernels()
    with tempfile.TemporaryDirectory() as tmp, cpu_harness.vllm_cpu_config(Path(tmp)) as config, kernels:
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
    device = torch.device(args.device)
    host_payloads = [checkpoint(args.layers, args.hidden, args.experts, seed) for seed in (1, 2)]
    payloads = [[(name, t.to(device)) for name, t in payload] for payload in host_payloads]

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def build_on_device() -> torch.nn.Module:
        with device:
            return build(args.layers, args.hidden, args.experts)

    build_times: list[float] = []

    def first_load(payload: list[tuple[str, torch.Tensor]]) -> tuple[float, float, int]:
        start = time.perf_counter()
        fresh = build_on_device()
        sync()
        build_times.append(time.perf_counter() - start)
        start, start_cpu, faults = time.perf_counter(), time.process_time(), minor_faults()
        fresh.load_weights(payload)
        process_weights_after_loading(fresh)
        sync()
        timing = time.perf_counter() - start, time.process_time() - start_cpu, minor_faults() - faults
        del fresh
        gc.collect()  # vLLM's loaders are bound methods: a cycle; free the model's memory now, not timed
        return timing

    model = build_on_device()
    DummyModelLoader(LoadConfig(load_format="dummy")).load_weights(model, config.model_config)
    process_weights_after_loading(model)
    before = pointers(model)
    refit_weights(model, payloads[1])  # warm-up (first-call imports)
    first_load(payloads[1])

    import cProfile

    profiler = cProfile.Profile() if args.profile else None
    load_times, refit_times, load_cpu, refit_cpu, load_faults, refit_faults, host_times = [], [], [], [], [], [], []
    for i in range(args.repeat):
        wall, cpu, faults = first_load(payloads[i % 2])
        load_times.append(wall)
        load_cpu.append(cpu)
        load_faults.append(faults)
        if device.type == "cuda":
            host_times.append(first_load(host_payloads[i % 2])[0])

        gc.collect()
        sync()
        start, start_cpu, faults = time.perf_counter(), time.process_time(), minor_faults()
        if profiler is not None:
            profiler.enable()
        refit_weights(model, payloads[i % 2])
        if profiler is not None:
            profiler.disable()
        sync()
        refit_times.append(time.perf_counter() - start)
        refit_cpu.append(time.process_time() - start_cpu)
        refit_faults.append(minor_faults() - faults)

    if profiler is not None:
        import pstats

        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    moved = sorted(name for name, ptr in pointers(model).items() if before.get(name) != ptr)
    load, refit = statistics.median(load_times), statistics.median(refit_times)
    result = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
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
        # vLLM's load_model also builds the model (create_weights) before loading: with it counted
        "build_s": round(statistics.median(build_times), 4),
        "ratio_to_build_and_load": round(refit / (load + statistics.median(build_times)), 3),
        "first_load_faults": int(statistics.median(load_faults)),
        "refit_faults": int(statistics.median(refit_faults)),
        **({"first_load_from_host_s": round(statistics.median(host_times), 4),
            "ratio_to_host_load": round(refit / statistics.median(host_times), 3)} if host_times else {}),
        "torch_threads": torch.get_num_threads(),
        # what vLLM chose for these layers: the refit re-runs the same processing (e.g. Marlin's repack)
        "linear_kernel": type(getattr(model.layers[0].quant_method, "kernel", None)).__name__,
        **({"moe_backend": getattr(getattr(model.moe.routed.quant_method, "nvfp4_backend", None), "value", None)}
           if args.experts else {}),
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
