"""Interpreter start-up with patchkit installed and PATCHKIT_AUTOLOAD unset, against without patchkit.

Builds bare virtualenvs in a temp folder from this interpreter: ``with`` holds patchkit installed
from this checkout as a wheel (so its ``.pth`` start-up hook is in site-packages) and its
dependencies; ``without`` and ``control`` each hold the same dependencies and no patchkit. All run
``python -c pass`` many times, interleaved in rotating order so drift in machine load hits each
alike; the medians and ratios are printed. ``control / without`` compares two identical venvs: it
is the noise floor the ``with / without`` ratio should be read against. A last, shorter series
shows the cost with autoload on (the shipped catalogue, nothing imported), for scale.

    python benchmarks/bench_startup_autoload.py [--repeats 200]
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPENDENCIES = ["packaging>=23", "wrapt>=2", "PyYAML>=6"]


def make_venv(path: Path, requirements: list[str]) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   check=True, capture_output=True, text=True).stdout.strip()
    # pip of this interpreter installs into the bare venv's site-packages, as a wheel install would.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--target",
                    site_packages, *requirements], check=True)
    return python


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def start_once(python: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one ``python -c pass``. CPU time is far less disturbed by other work
    on a shared machine than wall time."""
    cpu, started = _children_cpu(), time.perf_counter()
    subprocess.run([str(python), "-c", "pass"], check=True, env=env)
    return time.perf_counter() - started, _children_cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=200, help="start-ups per interpreter (default 200)")
    args = parser.parse_args()
    # Cached bytecode, as users get it: some shells export PYTHONDONTWRITEBYTECODE.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PATCHKIT_") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        with_patchkit = make_venv(Path(tmp, "with"), [str(ROOT), *DEPENDENCIES])
        without_patchkit = make_venv(Path(tmp, "without"), DEPENDENCIES)
        control = make_venv(Path(tmp, "control"), DEPENDENCIES)
        hook = list(Path(tmp, "with").rglob("zz_patchkit_autoload.pth"))
        if not hook:
            sys.exit("the patchkit wheel did not install its start-up hook; nothing to measure")
        pythons = {"with": with_patchkit, "without": without_patchkit, "control": control}
        for python in pythons.values():  # warm the page cache before timing
            for _ in range(5):
                start_once(python, env)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in pythons}
        order = list(pythons)
        for _ in range(args.repeats):
            order = order[1:] + order[:1]  # each venv takes each position in turn
            for name in order:
                times[name].append(start_once(pythons[name], env))
        autoload_on = [start_once(with_patchkit, {**env, "PATCHKIT_AUTOLOAD": "1"})
                       for _ in range(max(10, args.repeats // 4))]
    wall = {name: statistics.median(t[0] for t in values) * 1e3 for name, values in times.items()}
    cpu = {name: statistics.median(t[1] for t in values) * 1e3 for name, values in times.items()}
    on_wall = statistics.median(t[0] for t in autoload_on) * 1e3
    on_cpu = statistics.median(t[1] for t in autoload_on) * 1e3
    print(f"interpreter start-up, median of {args.repeats} interleaved runs of `python -c pass`:")
    print(f"  {'':44} {'wall ms':>8} {'cpu ms':>8}")
    rows = [("without patchkit", "without"), ("control (a second venv without patchkit)", "control"),
            ("patchkit installed, PATCHKIT_AUTOLOAD unset", "with")]
    for label, name in rows:
        print(f"  {label:44} {wall[name]:8.2f} {cpu[name]:8.2f}")
    print(f"  {'ratio installed / without':44} {wall['with'] / wall['without']:8.3f} "
          f"{cpu['with'] / cpu['without']:8.3f}")
    print(f"  {'ratio control / without (noise floor)':44} {wall['control'] / wall['without']:8.3f} "
          f"{cpu['control'] / cpu['without']:8.3f}")
    print(f"  {'for scale, PATCHKIT_AUTOLOAD=1':44} {on_wall:8.2f} {on_cpu:8.2f}")


if __name__ == "__main__":
    main()
