"""NVFP4 export throughput of bf16 weights against a plain copy of the same tensors, and its peak memory.

Workload (defaults): the linear weights of a few transformer layers (hidden 4096, SwiGLU 14336,
GQA 8 of 32 heads: qkv, proj, fc1, fc2 per layer), bf16, on one device; ``--experts N`` replaces the
dense MLP by N experts of ``--expert-ffn`` (each expert's fc1 and fc2 exported as its own tensor, as
the export streams them). Both sides read every weight once: the copy side ``clone()``s it; the
export side runs patchkit's quantize-and-pack (``_nvfp4_pack.quantize_nvfp4``: block amax, FP8 block
scales, E2M1 codes, two per byte) with the quantizer's calibrated amax, what ``export_qat_weights``
does per quantized linear. On CUDA both backends are timed in the same run: the fused Triton kernel
(what ``export_qat_weights`` uses there) and the torch ops (``--skip-torch`` leaves those out).

Throughput is bf16 bytes read per second; the figure is the ratio ``export / copy`` (goal on a GPU:
>= 0.8). The bound: a copy moves 4 bytes per weight (2 read, 2 written); the export reads 2 and
writes 0.5625 (E2M1 codes and E4M3 block scales), so at the copy's bandwidth it can reach
4 / 2.5625 = 1.56x. It needs no pass of its own for the per-tensor amax, because the quantizer holds
it (ModelOpt's own export reads ``_amax`` too); an export that had to compute it would read the
weights once more and be bound at 4 / 4.5625 = 0.88x. On CUDA the time is taken with CUDA events
around the whole loop (launch gaps included), median of ``--repeat`` after a warm-up.

Peak extra memory: on CUDA, ``max_memory_allocated`` above what the weights hold, while one layer
is exported; on CPU, the growth of the process's peak RSS over the same step (coarse: it includes
allocator slack, and reads 0 once an earlier step set a higher peak: use the CUDA figure). Both are
reported against the largest weight (goal: <= 2x). Run::

    python benchmarks/bench_export.py [--device cpu|cuda] [--layers 2] [--hidden 4096] [--ffn 14336] [--repeat 3]
        [--experts 0] [--expert-ffn 2048] [--skip-torch]
        [--compile]   # --compile: torch.compile the torch path too
"""

from __future__ import annotations

import resource
import statistics
import time

import torch
from _options import integer_options
from patchkit.patches.modelopt.qat._export_finite import NonFiniteWeights
from patchkit.patches.modelopt.qat._export_tensors import QuantSpec, checkpoint_stream, specs_on_device
from patchkit.patches.modelopt.qat._nvfp4_pack import quantize_nvfp4

import patchkit

#: Bytes a copy moves per weight (bf16 read and written) and the export (bf16 read, E2M1 + E4M3 written).
COPY_BYTES_PER_WEIGHT = 4.0
EXPORT_BYTES_PER_WEIGHT = 2.0 + 0.5 + 1.0 / 16
#: The same export with a pass of its own over the weights for the per-tensor amax.
EXPORT_WITH_AMAX_PASS_BYTES_PER_WEIGHT = EXPORT_BYTES_PER_WEIGHT + 2.0


def layer_weights(hidden: int, ffn: int, heads: int, groups: int, device: str, experts: int = 0,
                  expert_ffn: int = 2048) -> list[torch.Tensor]:
    head_dim = hidden // heads
    shapes = [((heads + 2 * groups) * head_dim, hidden), (hidden, hidden)]
    if experts:
        shapes += [(2 * expert_ffn, hidden), (hidden, expert_ffn)] * experts
    else:
        shapes += [(2 * ffn, hidden), (hidden, ffn)]
    return [torch.randn(shape, dtype=torch.bfloat16, device=device) for shape in shapes]


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, weights, device: str, repeat: int) -> float:
    """Median seconds of ``fn(weights)`` after a warm-up: CUDA events on a GPU, the wall clock on CPU."""
    fn(weights)  # warm-up (allocator, kernels)
    _sync(device)
    times = []
    for _ in range(repeat):
        if device.startswith("cuda"):
            start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start_event.record()
            fn(weights)
            end_event.record()
            end_event.synchronize()
            times.append(start_event.elapsed_time(end_event) / 1e3)
            continue
        start = time.perf_counter()
        fn(weights)
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_all(weights):
    for weight in weights:
        weight.clone()


def export_all(weights, amaxes, backend="auto"):
    """``grouped``: what ``export_qat_weights`` runs (the quantizers' amaxes, held on the host by
    ``quant_specs``, moved to the device in one copy; then ``checkpoint_stream``: small weights grouped
    into one launch, large ones one launch each); otherwise one
    ``quantize_nvfp4`` call a weight with that backend (given amaxes on the device: no host copy waits)."""
    if backend == "grouped":
        nonfinite = NonFiniteWeights()
        specs = specs_on_device({f"w{index}.weight": QuantSpec(16, amax.cpu()) for index, amax in enumerate(amaxes)},
                                weights[0].device)
        items = ((f"w{index}.weight", weight, specs[f"w{index}.weight"], False) for index, weight in enumerate(weights))
        for _ in checkpoint_stream(items, nonfinite):
            pass
        nonfinite.raise_if_any()
        return
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
    parser = integer_options(__doc__, layers=2, hidden=4096, ffn=14336, heads=32, groups=8, repeat=3, experts=0,
                             expert_ffn=2048)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--skip-torch", action="store_true", help="on CUDA, time the fused kernel only")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the per-slice quantize-and-pack (fuses its elementwise passes)")
    args = parser.parse_args()
    if args.compile:
        from patchkit.patches.modelopt.qat import _nvfp4_pack

        _nvfp4_pack._quantize_rows = torch.compile(_nvfp4_pack._quantize_rows, dynamic=True)
    torch.manual_seed(0)
    # Peak memory first, on a fresh process's one layer, before timing warms any allocator.
    shape_args = (args.hidden, args.ffn, args.heads, args.groups, args.device, args.experts, args.expert_ffn)
    one = layer_weights(*shape_args)
    one_amax = [w.float().abs().amax().cpu() for w in one]
    largest = max(w.numel() * w.element_size() for w in one)
    backends = ["grouped", "triton", "torch"] if args.device.startswith("cuda") else ["torch"]
    if args.skip_torch and len(backends) > 1:
        backends.remove("torch")
    one_amax_device = [amax.to(args.device) for amax in one_amax]
    peaks = {backend: peak_extra_bytes(one, one_amax if backend == "grouped" else one_amax_device, args.device, backend)
             for backend in backends}
    weights = one + [w for _ in range(args.layers - 1) for w in layer_weights(*shape_args)]
    amaxes = [w.float().abs().amax().cpu() for w in weights]
    amaxes_device = [amax.to(args.device) for amax in amaxes]
    total = sum(w.numel() * w.element_size() for w in weights)
    copy_s = timed(copy_all, weights, args.device, args.repeat)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    print(f"patchkit from {patchkit.__file__}")
    print(f"device {name}, {len(weights)} bf16 weights, {total / 2**30:.2f} GiB, median of {args.repeat}; "
          f"throughput in GB/s of bf16 weights read")
    print(f"copy            {total / copy_s / 1e9:10.1f} GB/s  ({copy_s * 1e3:.3f} ms; "
          f"{total * 2 / copy_s / 1e9:.0f} GB/s read + written)")
    bound = COPY_BYTES_PER_WEIGHT / EXPORT_BYTES_PER_WEIGHT
    bound_with_amax = COPY_BYTES_PER_WEIGHT / EXPORT_WITH_AMAX_PASS_BYTES_PER_WEIGHT
    for backend in backends:
        on = amaxes if backend == "grouped" else amaxes_device
        export_s = timed(lambda ws, b=backend, a=on: export_all(ws, a, b), weights, args.device, args.repeat)
        print(f"export {backend:8} {total / export_s / 1e9:10.1f} GB/s  ({export_s * 1e3:.3f} ms)  "
              f"export / copy: {copy_s / export_s:.3f}  (goal on GPU >= 0.8; bound {bound:.2f}x with the quantizer's "
              f"amax, {bound_with_amax:.2f}x with an amax pass)")
    for backend, peak in peaks.items():
        print(f"peak extra memory exporting one layer ({backend}): {peak / 2**20:.1f} MiB = {peak / largest:.2f}x "
              f"the largest weight ({largest / 2**20:.1f} MiB; goal <= 2x)")


if __name__ == "__main__":
    main()
