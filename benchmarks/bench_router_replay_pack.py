"""Pack + unpack of router replay indices: patchkit's vectorised THD packing vs a per-sample loop.

Workload (defaults): 256 samples of 1..4096 tokens (uniform), 48 MoE layers, top-8, one
``[batch, seq, layers, topk]`` index tensor (uint8, as rollout engines store routed experts) with
an attention mask. Both sides do the same work: build the padded THD layout (FP8 padding by
default, TP 1), pack the indices to ``[tokens, layers, topk]`` with distinct experts in padding
slots, and unpack them back to ``[batch, seq, layers, topk]``; results are checked equal.

The loop is the straightforward reference: per sample, copy its masked tokens into the packed
tensor (and back), as packing code in RL frameworks does. Run::

    python benchmarks/bench_router_replay_pack.py [--samples 256] [--max-len 4096] [--cp 1]
"""

from __future__ import annotations

import math
import statistics
import time

import torch
from _options import integer_options
from patchkit.patches.megatron import router_replay as replay


def loop_pack_unpack(per_sample, mask, tp, cp, fp8):
    """Reference: the padding rule and the copies, one sample at a time."""
    batch, seq_len = mask.shape
    trailing = per_sample.shape[2:]
    align = tp * cp * 2 if cp > 1 else tp
    seq_align = math.lcm(16, align) if fp8 else align
    lengths = mask.sum(dim=1).tolist()
    padded = [-(-n // seq_align) * seq_align for n in lengths]
    if fp8:
        padded[-1] += -sum(padded) % (align * 128)
    starts = [0]
    for p in padded:
        starts.append(starts[-1] + p)
    fill = torch.arange(trailing[-1], dtype=per_sample.dtype, device=per_sample.device).expand(trailing)

    ranks = []
    for rank in range(cp):
        out = fill.expand(starts[-1] // cp, *trailing).clone()
        for b in range(batch):
            tokens = per_sample[b, mask[b]]
            if cp == 1:
                out[starts[b] : starts[b] + lengths[b]] = tokens
                continue
            h = padded[b] // (2 * cp)
            base = starts[b] // cp
            for local, chunk in enumerate((rank, 2 * cp - 1 - rank)):
                piece = tokens[chunk * h : (chunk + 1) * h]
                out[base + local * h : base + local * h + piece.shape[0]] = piece
        ranks.append(out)

    back = torch.zeros_like(per_sample)
    for b in range(batch):
        if cp == 1:
            back[b, mask[b]] = ranks[0][starts[b] : starts[b] + lengths[b]]
            continue
        h = padded[b] // (2 * cp)
        base = starts[b] // cp
        sample = torch.empty(padded[b], *trailing, dtype=per_sample.dtype, device=per_sample.device)
        for rank in range(cp):
            for local, chunk in enumerate((rank, 2 * cp - 1 - rank)):
                sample[chunk * h : (chunk + 1) * h] = ranks[rank][base + local * h : base + (local + 1) * h]
        back[b, mask[b]] = sample[: lengths[b]]
    return ranks, back


def vectorised_pack_unpack(per_sample, mask, tp, cp, fp8):
    layout = replay.thd_layout(mask, tp_size=tp, cp_size=cp, fp8_padding=fp8)
    ranks = [replay.pack(per_sample, layout, cp_rank=r) for r in range(cp)]
    back = replay.unpack(ranks, layout)
    return ranks, back


def measure(fn, repeats, device):
    """Run ``fn`` ``repeats`` times; wall-clock seconds and (on CPU) process CPU seconds per run.

    CPU time is reported beside wall time because shared machines make wall time noisy: it counts
    only the cycles this process got.
    """
    walls, cpus = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return result, walls, cpus


def main() -> None:
    parser = integer_options(__doc__, samples=256, max_len=4096, layers=48, topk=8, tp=1, cp=1, repeats=3)
    parser.add_argument("--no-fp8", action="store_true")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    fp8 = not args.no_fp8
    device = torch.device(args.device)

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, args.max_len + 1, (args.samples,), generator=generator)
    mask = torch.arange(args.max_len) < lengths.unsqueeze(1)
    per_sample = torch.randint(
        0, 128, (args.samples, args.max_len, args.layers, args.topk), generator=generator, dtype=torch.uint8
    )
    per_sample[~mask] = 0
    per_sample, mask = per_sample.to(device), mask.to(device)

    work = dict(per_sample=per_sample, mask=mask, tp=args.tp, cp=args.cp, fp8=fp8)
    (loop_ranks, loop_back), loop_wall, loop_cpu = measure(
        lambda: loop_pack_unpack(**work), args.repeats, device
    )
    (vec_ranks, vec_back), vec_wall, vec_cpu = measure(
        lambda: vectorised_pack_unpack(**work), args.repeats, device
    )
    assert all(torch.equal(a, b) for a, b in zip(loop_ranks, vec_ranks, strict=True)), "packed tensors differ"
    assert torch.equal(loop_back, vec_back), "unpacked tensors differ"

    print(
        f"samples={args.samples} max_len={args.max_len} tokens={int(lengths.sum())} "
        f"packed={sum(r.shape[0] for r in vec_ranks)} layers={args.layers} topk={args.topk} "
        f"tp={args.tp} cp={args.cp} fp8={fp8} device={device} threads={torch.get_num_threads()}"
    )
    for name, wall, cpu in (("per-sample loop", loop_wall, loop_cpu), ("vectorised", vec_wall, vec_cpu)):
        print(
            f"{name:16s}: wall best {min(wall) * 1e3:9.1f} ms (median {statistics.median(wall) * 1e3:9.1f})"
            f"   cpu best {min(cpu) * 1e3:9.1f} ms"
        )
    print(f"speed-up (wall, best)  : {min(loop_wall) / min(vec_wall):.1f}x")
    if device.type == "cpu":
        print(f"speed-up (cpu, best)   : {min(loop_cpu) / min(vec_cpu):.1f}x")


if __name__ == "__main__":
    main()
