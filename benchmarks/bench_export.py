"""NVFP4 export throughput of bf16 weights against a plain copy of the same tensors, and its peak memory.

Workload (defaults): the linear weights of a few transformer layers (hidden 4096, SwiGLU 14336,
GQA 8 of 32 heads: qkv, proj, fc1, fc2 per layer), bf16, on one device. Both sides read every
weight once: the copy side ``clone()``s it; the export side runs patchkit's quantize-and-pack
(``_nvfp4_pack.quantize_nvfp4``: block amax, FP8 block scales, E2M1 codes, two per byte), what
``export_qat_weights`` does per quantized linear. Throughput is bf16 bytes read per second; the
ratio ``export / copy`` is the figure (goal on a GPU: >= 0.5). On CUDA both backends are timed in
the same run: the fused Triton kernel (what ``export_qat_weights`` uses there) and the torch ops.

Peak extra memory: on CUDA, ``max_memory_allocated`` above what the weights hold, while one layer
is exported; on CPU, the growth of the process's peak RSS over the same step (coarse: it includes
allocator slack, and reads 0 once an earlier step set a higher peak: use the CUDA figure). Both are
reported against the largest weight (goal: <= 2x). Run::

    python benchmarks/bench_export.py [--device cpu|cuda] [--layers 2] [--hidden 4096] [--ffn 14336] [--repeat 3]
        [--compile]   # --compile: torch.compile the torch path too
"""

from __future__ import annotations

import resource
import statistics
import time

import torch
from _options import integer_options
from patchkit.patches.modelopt.qat._nvfp4_pack import quantize_nvfp4


def layer_weights(hidden: int, ffn: int, heads: int, groups: int, device: str) -> list[torch.Tensor]:
    head_dim = hidden // heads
    shapes = [((heads + 2 * groups) * head_dim, hidden), (hidden, hidden), (2 * ffn, hidden), (hidden, ffn)]
    return [torch.randn(shape, dtype=torch.bfloat16, device=device) for shape in shapes]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, weights, device: str, repeat: int) -> float:
    fn(weights)  # warm-up (allocator, kernels)
    _sync(device)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(weights)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_all(weights):
    for weight in weights:
        weight.clone()


def export_all(weights, amaxes, backend="auto"):
    for weight, amax in zip(weights, amaxes, strict=True):
        quantize_nvfp4(weight, amax, backend=backend)


def peak_extra_bytes(weights, amaxes, device: str, backend: str = "auto") -> int:
    """Extra memory while exporting: outputs plus temporaries of the largest layer's weights."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        export_all(weights, amaxes, backend)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    export_all(weights, amaxes, backend)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def main() -> None:
    parser = integer_options(__doc__, layers=2, hidden=4096, ffn=14336, heads=32, groups=8, repeat=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the per-slice quantize-and-pack (fuses its elementwise passes)")
    args = parser.parse_args()
    if args.compile:
        from patchkit.patches.modelopt.qat import _nvfp4_pack

        _nvfp4_pack._quantize_rows = torch.compile(_nvfp4_pack._quantize_rows, dynamic=True)
    torch.manual_seed(0)
    # Peak memory first, on a fresh process's one layer, before timing warms any allocator.
    one = layer_weights(args.hidden, args.ffn, args.heads, args.groups, args.device)
    one_amax = [w.float().abs().amax() for w in one]
    largest = max(w.numel() * w.element_size() for w in one)
    backends = ["triton", "torch"] if args.device.startswith("cuda") else ["torch"]
    peaks = {backend: peak_extra_bytes(one, one_amax, args.device, backend) for backend in backends}
    weights = one + [w for _ in range(args.layers - 1)
                     for w in layer_weights(args.hidden, args.ffn, args.heads, args.groups, args.device)]
    amaxes = [w.float().abs().amax() for w in weights]
    total = sum(w.numel() * w.element_size() for w in weights)
    copy_s = timed(copy_all, weights, args.device, args.repeat)
    print(f"device {args.device}, {len(weights)} bf16 weights, {total / 2**30:.2f} GiB, median of {args.repeat}")
    print(f"copy            {total / copy_s / 2**20:10.1f} MiB/s  ({copy_s * 1e3:.2f} ms)")
    for backend in backends:
        export_s = timed(lambda ws, b=backend: export_all(ws, amaxes, b), weights, args.device, args.repeat)
        print(f"export {backend:8} {total / export_s / 2**20:10.1f} MiB/s  ({export_s * 1e3:.2f} ms)  "
              f"export / copy: {copy_s / export_s:.3f}  (goal on GPU >= 0.5)")
    for backend, peak in peaks.items():
        print(f"peak extra memory exporting one layer ({backend}): {peak / 2**20:.1f} MiB = {peak / largest:.2f}x "
              f"the largest weight ({largest / 2**20:.1f} MiB; goal <= 2x)")


if __name__ == "__main__":
    main()
