"""The whole ``patchkit doctor`` on CPU, with the upstreams installed in this environment.

Runs ``patchkit doctor --json --device cpu`` in fresh processes (as a user runs it) and reports, as
medians: the wall time of the whole process (interpreter start to exit), the doctor's own split into
import-and-apply (``import_and_apply_seconds``: importing patchkit, the upstream targets of every
patch, and applying) and the self-checks, and each check's time. Goal (issue 14): under 60 s for
the whole doctor with megatron-core and ModelOpt installed, on the project's 2-core machine.

    python benchmarks/bench_doctor.py [--runs 3] [--patch GLOB ...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

GOAL_SECONDS = 60.0


def one_run(patterns: list[str]) -> dict:
    command = [sys.executable, "-m", "patchkit", "doctor", "--json", "--device", "cpu"]
    for pattern in patterns:
        command += ["--patch", pattern]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if not done.stdout.strip():
        raise SystemExit(f"doctor printed no report (exit {done.returncode}):\n{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    report["wall_seconds"] = wall
    report["cpu_seconds"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    report["exit_status"] = done.returncode
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--patch", action="append", default=[], metavar="GLOB")
    args = parser.parse_args()
    runs = [one_run(args.patch) for _ in range(args.runs)]

    def median(key: str) -> float:
        return statistics.median(float(r[key]) for r in runs)

    checks: dict[str, list[float]] = {}
    verdicts: dict[str, str] = {}
    for report in runs:
        for patch in report["patches"]:
            checks.setdefault(patch["id"], []).append(patch["seconds"])
            verdicts[patch["id"]] = patch["verdict"]
    whole = median("wall_seconds")
    imports = median("import_and_apply_seconds")
    in_doctor = median("total_seconds")
    print(f"patchkit doctor --device cpu, Python {runs[0]['python']}, {os.cpu_count()} CPUs, "
          f"median of {len(runs)} fresh processes; load average {os.getloadavg()[0]:.1f}")
    print(f"  whole process (wall):           {whole:6.1f} s   (CPU {median('cpu_seconds'):.1f} s)")
    print(f"  import and apply (in doctor):   {imports:6.1f} s")
    print(f"  self-checks (in doctor):        {in_doctor - imports:6.1f} s")
    print(f"  interpreter start and exit:     {whole - in_doctor:6.1f} s")
    for patch_id, seconds in checks.items():
        print(f"    {patch_id:<45} {verdicts[patch_id]:<15} {statistics.median(seconds):5.2f} s")
    print(f"goal: whole doctor under {GOAL_SECONDS:g} s: {'met' if whole < GOAL_SECONDS else 'MISSED'}; "
          f"exit status {runs[-1]['exit_status']}")


if __name__ == "__main__":
    main()
