"""Start-up against the size of the catalogue: the shipped one, then the same plus 100 declarations.

The 100 declarations are generated into a temporary catalogue package (an upstream folder of 100
declaration modules and its index, written by the same generator as the shipped index; one such
package per copy of patchkit measured, by that copy's generator), each a
patch of an upstream that is installed but not imported (default: megatron-core), waiting for a
module of its own. Each fresh interpreter times, in process, what ``apply_all()`` costs at start-up
with the catalogue read from its index: reading the index(es), settling every patch and arming the
hooks (the start-up pass, ``process_engine.apply_all_from_index``; code older than it builds the
engine and decides every patch, which is what its ``apply_all()`` did). Both sides alternate process
by process in one run (so machine load hits both alike); the figure is the difference of medians
(CPU time of the process, far less disturbed by other work on a shared machine than wall time,
which is printed beside it). Goal: at most +1 ms for the 100.

It also prints the garbage collector's share of the pass: the objects the added patches allocate can
tip a collection of the first generation that the interpreter's start-up left due, which the shipped
side then owes at its next collection after the pass (counted as "whose next collection ... takes it").

``--code LABEL=PATH`` (repeatable) runs the same measure for each copy of patchkit at ``PATH`` (put
first on ``PYTHONPATH``; e.g. ``pip install --no-deps --target PATH`` of two revisions), all of them
alternated in one run; without it, the patchkit this interpreter imports.

    python benchmarks/bench_startup_scaling.py [--runs 31] [--count 100] [--dist megatron-core --module megatron.core]
                                               [--code before=DIR --code after=DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "pk_bench_scaling_catalogue"
DECLARATION = '''
from patchkit import Patch, Variant, Wrap

PATCHES = (
    Patch(
        id="bench.patch_{n:03d}",
        summary="A generated patch {n} for the start-up scaling benchmark.",
        why="It waits for a module of its own, as a real patch waits for its upstream's code.",
        upstream="https://example.invalid/upstream/{n}",
        removal="Never: it exists only in a temporary catalogue.",
        version_modules={{{dist!r}: {module!r}}},
        variants=(
            Variant(requires={{{dist!r}: ">=0.1,<0.18"}},
                    installs=(Wrap("{module}.bench_{n:03d}:forward", "._impl:wrap"),)),
            Variant(requires={{{dist!r}: ">=0.18"}},
                    installs=(Wrap("{module}.bench_{n:03d}:forward", "._impl:wrap"),)),
        ),
    ),
)
'''
TIMED = """
import gc, sys, time
sys.path.insert(0, {root!r})
collecting = []
def timed_collections(phase, info, clock=time.perf_counter):
    # The garbage collector's own time inside the timed window (wall; each pass is on this thread).
    collecting.append((phase, info["generation"], clock()))
import patchkit
from patchkit.runtime import process_engine
packages = {packages!r}
gc.callbacks.append(timed_collections)
if hasattr(process_engine, "apply_all_from_index"):  # what the first patchkit.apply_all() of a process runs
    cpu, wall = time.process_time(), time.perf_counter()
    statuses = process_engine.apply_all_from_index(catalogues=packages)
    cpu, wall = (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000
    assert statuses is not None, "the start-up pass did not settle every patch"
else:  # code before the start-up pass: its apply_all() built the engine and decided every patch
    from patchkit.runtime import catalogue
    from patchkit.runtime.engine import Engine
    cpu, wall = time.process_time(), time.perf_counter()
    patches, errors = [], []
    for package in packages:
        found, failed = catalogue.load(package)
        patches += found
        errors += failed
    statuses = Engine(patches, errors).apply_all()
    cpu, wall = (time.process_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000
gc.callbacks.remove(timed_collections)
ends = [(generation, at) for phase, generation, at in collecting if phase == "stop"]
starts = [at for phase, _, at in collecting if phase == "start"]
in_gc = sum(end - start for (_, end), start in zip(ends, starts)) * 1000
oldest = max((generation for generation, _ in ends), default=-1)
owed = int(gc.get_count()[1] >= gc.get_threshold()[1])  # its next collection takes the first generation too
leaked = [m for m in sys.modules if m.startswith({package!r} + ".extra.")]
assert not leaked, leaked
print(f"{{cpu:.3f}} {{wall:.3f}} {{len(statuses)}} {{sum(s.state.value == 'pending' for s in statuses)}} "
      f"{{in_gc:.3f}} {{oldest}} {{owed}}")
"""
# Cached bytecode, as users have it (some shells export PYTHONDONTWRITEBYTECODE).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def make_catalogue(root: Path, count: int, dist: str, module: str, path: str | None = None) -> None:
    """A catalogue package of ``count`` declarations in upstream folder ``extra``, and its index."""
    upstream = root / PACKAGE / "extra"
    upstream.mkdir(parents=True)
    (root / PACKAGE / "__init__.py").write_text("")
    (upstream / "__init__.py").write_text("")
    (upstream / "_impl.py").write_text("def wrap(original):\n    return original\n")
    for n in range(count):
        (upstream / f"patch_{n:03d}.py").write_text(DECLARATION.format(n=n, dist=dist, module=module))
    code = f"import sys; sys.path.insert(0, {str(root)!r}); from patchkit.matrix import catalogue_index; " \
           f"catalogue_index.write({PACKAGE!r})"
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(path), cwd=tempfile.gettempdir())


def _env(path: str | None) -> dict[str, str]:
    """The benchmark's environment, with ``path`` (a copy of patchkit) first on ``PYTHONPATH``."""
    if path is None:
        return ENV
    return {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [path, ENV.get("PYTHONPATH")]))}


def run(root: Path, packages: list[str], path: str | None = None) -> tuple[float, float, int, int, float, int, int]:
    """One fresh process: CPU and wall ms of the pass, patches, pending ones, ms the garbage collector
    ran inside the pass, the oldest generation it collected there (-1: none), and 1 if the process's
    next collection (after the pass) is due to take the first generation as well."""
    code = TIMED.format(root=str(root), packages=packages, package=PACKAGE)
    out = subprocess.run([sys.executable, "-c", code], check=True, env=_env(path), capture_output=True, text=True,
                         cwd=tempfile.gettempdir()).stdout
    cpu, wall, total, pending, in_gc, oldest, owed = out.split()
    return float(cpu), float(wall), int(total), int(pending), float(in_gc), int(oldest), int(owed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=31)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--dist", default="megatron-core", help="an installed distribution (default: %(default)s)")
    parser.add_argument("--module", default="megatron.core", help="its import package (default: %(default)s)")
    parser.add_argument("--code", action="append", default=[], metavar="LABEL=PATH",
                        help="a copy of patchkit to measure (first on PYTHONPATH); repeat to alternate several")
    args = parser.parse_args()
    sides: list[tuple[str, str | None]] = [(label, path) for label, _, path in (c.partition("=") for c in args.code)]
    sides = sides or [("", None)]
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(args.dist)
    except PackageNotFoundError:
        sys.exit(f"{args.dist} is not installed here: the generated patches must be of an installed upstream")
    with tempfile.TemporaryDirectory() as tmp:
        # A catalogue per side, its index written by that side's generator (the index's format may differ).
        roots = {name: Path(tmp) / str(n) for n, (name, _) in enumerate(sides)}
        for name, path in sides:
            make_catalogue(roots[name], args.count, args.dist, args.module, path)
        real, plus = ["patchkit.patches"], ["patchkit.patches", PACKAGE]
        for name, path in sides:
            run(roots[name], plus, path)  # compile the bytecode once
        results: dict[str, tuple[list, list]] = {name: ([], []) for name, _ in sides}
        for _ in range(args.runs):
            for name, path in sides:
                results[name][0].append(run(roots[name], real, path))
                results[name][1].append(run(roots[name], plus, path))
    sys.stdout.write(f"load average {os.getloadavg()[0]:.1f}\n")
    for name, (alone, more) in results.items():
        report(f"{name}: " if name else "", alone, more, args)


def report(prefix: str, alone: list, more: list, args: argparse.Namespace) -> None:
    assert more[0][3] - alone[0][3] == args.count, "every generated patch should wait for its module"
    for label, i in (("cpu", 0), ("wall", 1)):
        a, m = [r[i] for r in alone], [r[i] for r in more]
        sys.stdout.write(
            f"{prefix}catalogue read from its index + apply_all(), {label}, {args.runs} alternated processes: "
            f"shipped catalogue ({alone[0][2]} patches) median {statistics.median(a):.2f} ms (min {min(a):.2f}); "
            f"plus {args.count} declarations of {args.dist} (installed, not imported) median "
            f"{statistics.median(m):.2f} ms (min {min(m):.2f}); "
            f"added {statistics.median(m) - statistics.median(a):+.2f} ms (min to min {min(m) - min(a):+.2f})"
            f"{' (goal: at most +1 ms)' if label == 'cpu' else ''}\n")
    a, m = [r[4] for r in alone], [r[4] for r in more]
    sys.stdout.write(
        f"{prefix}of which the garbage collector (wall, inside the pass): median {statistics.median(a):.2f} vs "
        f"{statistics.median(m):.2f} ms, added {statistics.median(m) - statistics.median(a):+.2f} ms; processes whose "
        f"pass collected the first generation: {sum(r[5] >= 1 for r in alone)} vs {sum(r[5] >= 1 for r in more)} "
        f"of {args.runs}; whose next collection after the pass takes it: {sum(r[6] for r in alone)} vs "
        f"{sum(r[6] for r in more)}\n")


if __name__ == "__main__":
    main()
