"""Start-up with the upstreams installed: whole-process and in-process figures in one run.

1. Whole process: ``python -c "import patchkit; patchkit.apply_all()"`` against ``python -c pass``,
   alternated pair by pair in one run (so machine load hits both alike), in the current environment,
   which should have megatron-core and ModelOpt installed and not imported. Wall and CPU time
   (user+sys of the child; far less disturbed by other work on a shared machine) are reported as
   medians, with the added milliseconds and the ratio. Goal: at most +15 ms.
2. What start-up loads: the modules ``import patchkit; patchkit.apply_all()`` adds to a bare
   interpreter, patchkit's own counted apart (each costs its import; the runtime's are listed in
   docs/architecture.md).
3. In process, megatron-core already imported: the time of ``patchkit.apply_all()`` alone, drift
   checking included, in fresh interpreters (each one run); first with an empty fingerprint cache
   (the first process on a machine), then with the cache the first run wrote. Goal: at most 10 ms.

    python benchmarks/bench_startup_upstreams.py [--runs 21] [--no-in-process]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

PATCHKIT = "import patchkit; patchkit.apply_all()"
IN_PROCESS = """
import time, megatron.core.models.gpt.gpt_model, megatron.core.transformer.moe.router
import megatron.core.transformer.moe.token_dispatcher, megatron.core.transformer.multi_token_prediction
import patchkit
patchkit.engine()  # the catalogue's index, read by import-time autoload in real jobs, is not what is timed
start = time.perf_counter()
statuses = patchkit.apply_all()
elapsed = (time.perf_counter() - start) * 1000
print(f"{elapsed:.3f}", ",".join(f"{s.id}={s.state.value}" for s in statuses if s.state.value != "skipped"))
"""
# Cached bytecode, as users have it (some shells export PYTHONDONTWRITEBYTECODE).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ms(code: str) -> tuple[float, float]:
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000


def whole_process(runs: int) -> None:
    run_ms(PATCHKIT)
    base, patched = [], []
    for _ in range(runs):
        base.append(run_ms("pass"))
        patched.append(run_ms(PATCHKIT))
    for label, i in (("wall", 0), ("cpu", 1)):
        bs, ps = [r[i] for r in base], [r[i] for r in patched]
        b, p = statistics.median(bs), statistics.median(ps)
        sys.stdout.write(f"whole process, {label}, {runs} alternated pairs: python -c pass median {b:.1f} ms "
                         f"(min {min(bs):.1f}); import patchkit + apply_all() median {p:.1f} ms (min {min(ps):.1f}); "
                         f"added {p - b:+.1f} ms median, {min(ps) - min(bs):+.1f} ms min to min ({p / b:.2f}x); "
                         f"goal: at most +15 ms\n")


MODULES = """
import sys
bare = set(sys.modules)
import patchkit
patchkit.apply_all()
added = sorted(set(sys.modules) - bare)
print(len(added), sum(m.startswith("patchkit") for m in added), sum(m.startswith("patchkit.patches") for m in added))
"""


def modules_loaded() -> None:
    added, own, catalogue = subprocess.run([sys.executable, "-c", MODULES], check=True, env=ENV, capture_output=True,
                                           text=True).stdout.split()
    sys.stdout.write(f"start-up loads {added} modules: {own} of patchkit ({catalogue} of them the catalogue's), "
                     f"{int(added) - int(own)} of the standard library\n")


def in_process(runs: int) -> None:
    with tempfile.TemporaryDirectory() as cache:
        env = {**ENV, "XDG_CACHE_HOME": cache}
        for label, n in (("empty fingerprint cache", 1), ("warm fingerprint cache", runs)):
            times = []
            for _ in range(n):
                out = subprocess.run([sys.executable, "-c", IN_PROCESS], check=True, env=env, capture_output=True,
                                     text=True).stdout.split()
                times.append(float(out[0]))
            applied = out[1] if len(out) > 1 else ""
            sys.stdout.write(f"in process, megatron-core imported, {label}: apply_all() median "
                             f"{statistics.median(times):.1f} ms of {n} (min {min(times):.1f}, max {max(times):.1f}); "
                             f"goal: at most 10 ms (warm cache); {applied}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--no-in-process", action="store_true", help="parts 1 and 2 only (3 imports torch per run)")
    args = parser.parse_args()
    whole_process(args.runs)
    modules_loaded()
    if not args.no_in_process:
        in_process(args.runs)


if __name__ == "__main__":
    main()
