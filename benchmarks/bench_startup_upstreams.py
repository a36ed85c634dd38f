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
   (the first process on a machine), then with the cache the first run wrote. Wall time, and the
   process's CPU time beside it (a loaded machine delays the call without making it costlier).
   Goal: at most 10 ms.

``--code LABEL=PATH`` (repeatable) measures each copy of patchkit at ``PATH`` (put first on
``PYTHONPATH``; e.g. ``pip install --no-deps --target PATH`` of two revisions), every copy alternated
with the others and with ``python -c pass`` run by run; without it, the patchkit this interpreter
imports. Children run from the temporary folder, so a checkout in the current folder is not imported.

    python benchmarks/bench_startup_upstreams.py [--runs 21] [--no-in-process] [--code before=DIR --code after=DIR]
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
cpu, start = time.process_time(), time.perf_counter()
statuses = patchkit.apply_all()
elapsed, cpu = (time.perf_counter() - start) * 1000, (time.process_time() - cpu) * 1000
applied = ",".join(f"{s.id}={s.state.value}" for s in statuses if s.state.value != "skipped")
print(f"{elapsed:.3f}", f"{cpu:.3f}", applied)
"""
# Cached bytecode, as users have it (some shells export PYTHONDONTWRITEBYTECODE).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _env(path: str | None, base: dict[str, str] = ENV) -> dict[str, str]:
    if path is None:
        return base
    return {**base, "PYTHONPATH": os.pathsep.join(filter(None, [path, base.get("PYTHONPATH")]))}


def run_ms(code: str, path: str | None = None) -> tuple[float, float]:
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(path), stdout=subprocess.DEVNULL,
                   cwd=tempfile.gettempdir())
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu) * 1000


def whole_process(runs: int, sides: list[tuple[str, str | None]]) -> None:
    for _, path in sides:
        run_ms(PATCHKIT, path)
    base: list[tuple[float, float]] = []
    patched: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in sides}
    for _ in range(runs):
        base.append(run_ms("pass"))
        for name, path in sides:
            patched[name].append(run_ms(PATCHKIT, path))
    sys.stdout.write(f"load average {os.getloadavg()[0]:.1f}\n")
    for label, i in (("wall", 0), ("cpu", 1)):
        bs = [r[i] for r in base]
        b = statistics.median(bs)
        for name, runs_of_side in patched.items():
            ps = [r[i] for r in runs_of_side]
            p = statistics.median(ps)
            sys.stdout.write(f"{name + ': ' if name else ''}whole process, {label}, {runs} alternated runs: "
                             f"python -c pass median {b:.1f} ms (min {min(bs):.1f}); import patchkit + apply_all() "
                             f"median {p:.1f} ms (min {min(ps):.1f}); added {p - b:+.1f} ms median, "
                             f"{min(ps) - min(bs):+.1f} ms min to min ({p / b:.2f}x); goal: at most +15 ms\n")


MODULES = """
import sys
bare = set(sys.modules)
import patchkit
patchkit.apply_all()
added = sorted(set(sys.modules) - bare)
print(len(added), sum(m.startswith("patchkit") for m in added), sum(m.startswith("patchkit.patches") for m in added))
"""


def modules_loaded(sides: list[tuple[str, str | None]]) -> None:
    for name, path in sides:
        added, own, catalogue = subprocess.run([sys.executable, "-c", MODULES], check=True, env=_env(path),
                                               capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout.split()
        sys.stdout.write(f"{name + ': ' if name else ''}start-up loads {added} modules: {own} of patchkit ({catalogue} "
                         f"of them the catalogue's), {int(added) - int(own)} of the standard library\n")


def in_process(runs: int, sides: list[tuple[str, str | None]]) -> None:
    """Each side with a fingerprint cache of its own: one process with it empty, then ``runs`` with the
    cache it wrote, the sides alternated process by process."""
    with tempfile.TemporaryDirectory() as caches:
        envs = {name: _env(path, {**ENV, "XDG_CACHE_HOME": os.path.join(caches, str(n))})
                for n, (name, path) in enumerate(sides)}
        for label, n in (("empty fingerprint cache", 1), ("warm fingerprint cache", runs)):
            times: dict[str, list[float]] = {name: [] for name, _ in sides}
            cpu: dict[str, list[float]] = {name: [] for name, _ in sides}
            applied: dict[str, str] = {}
            for _ in range(n):
                for name, _ in sides:
                    out = subprocess.run([sys.executable, "-c", IN_PROCESS], check=True, env=envs[name],
                                         capture_output=True, text=True, cwd=tempfile.gettempdir()).stdout.split()
                    times[name].append(float(out[0]))
                    cpu[name].append(float(out[1]))
                    applied[name] = out[2] if len(out) > 2 else ""
            for name, found in times.items():
                sys.stdout.write(f"{name + ': ' if name else ''}in process, megatron-core imported, {label}: "
                                 f"apply_all() median {statistics.median(found):.1f} ms of {n} (min {min(found):.1f}, "
                                 f"max {max(found):.1f}; CPU median {statistics.median(cpu[name]):.1f} ms, min "
                                 f"{min(cpu[name]):.1f}); goal: at most 10 ms (warm cache); {applied[name]}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--no-in-process", action="store_true", help="parts 1 and 2 only (3 imports torch per run)")
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=PATH",
                        help="a copy of patchkit to measure (first on PYTHONPATH); repeat to alternate several")
    args = parser.parse_args()
    sides: list[tuple[str, str | None]] = [(label, path) for label, _, path in (c.partition("=") for c in args.code)]
    sides = sides or [("", None)]
    whole_process(args.runs, sides)
    modules_loaded(sides)
    if not args.no_in_process:
        in_process(args.runs, sides)


if __name__ == "__main__":
    main()
