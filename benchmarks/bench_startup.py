"""Start-up cost of ``import patchkit; patchkit.apply_all()`` against ``python -c pass``.

Both commands alternate in one run so machine load affects them alike; the figure is the difference
of medians. Wall time is what a user waits; CPU time (user+sys of the child) is reported beside it
because it is far less disturbed by other work on a shared machine. Goal (issue 2): at most +15 ms
with no upstream imported.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time

RUNS = 40
BASELINE = "pass"
PATCHKIT = "import patchkit; patchkit.apply_all()"


# Measure what users get: cached bytecode. (Some shells export PYTHONDONTWRITEBYTECODE, which would
# make every run recompile patchkit from source.)
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ms(code: str) -> tuple[float, float]:
    """(wall, cpu) milliseconds of one fresh interpreter running ``code``."""
    cpu_before, start = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=ENV)
    return (time.perf_counter() - start) * 1000, (_children_cpu() - cpu_before) * 1000


def main() -> None:
    run_ms(PATCHKIT)  # compile the .pyc files once
    baseline, patched = [], []
    for _ in range(RUNS):
        baseline.append(run_ms(BASELINE))
        patched.append(run_ms(PATCHKIT))
    for label, index in (("wall", 0), ("cpu", 1)):
        base = statistics.median(run[index] for run in baseline)
        with_patchkit = statistics.median(run[index] for run in patched)
        sys.stdout.write(
            f"start-up {label} time, median of {RUNS}: python -c pass {base:.1f} ms; "
            f"import patchkit + apply_all() {with_patchkit:.1f} ms; "
            f"added {with_patchkit - base:+.1f} ms (ratio {with_patchkit / base:.2f}x)\n"
        )


if __name__ == "__main__":
    main()
