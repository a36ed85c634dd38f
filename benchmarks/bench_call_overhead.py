"""Per-call cost of a method patched through patchkit against calling the replacement directly.

patchkit's ``Replace`` installs the replacement function itself, so a patched call should cost what a
direct call costs. ``Wrap`` installs whatever the factory returns; a closure costs one extra frame.
wrapt's ``FunctionWrapper`` is measured in the same run for reference. Goal (issue 2): at most
+150 ns per call.
"""

from __future__ import annotations

import sys
import timeit
import types

import wrapt

from patchkit import Engine, Patch, Registered, Replace, Variant, Wrap

CALLS = 2_000_000
REPEATS = 7


class Model:
    def forward(self, x):
        return x


def replacement(self, x):
    return x + 1


def delegate(original):
    def forward(self, x):
        return original(self, x) + 1

    return forward


def best_ns(stmt, setup_globals) -> float:
    timer = timeit.Timer(stmt, globals=setup_globals)
    return min(timer.repeat(repeat=REPEATS, number=CALLS)) / CALLS * 1e9


def engine_with(action) -> Engine:
    """An engine holding one patch of ``action``; ``packaging`` stands in as an installed distribution."""
    patch = Patch(id="bench.call", summary="", why="", upstream="", removal="",
                  variants=(Variant(requires={"packaging": ">=0"}, installs=(action,)),))
    return Engine([Registered(patch, None)])


def main() -> None:
    module = types.ModuleType("bench_upstream")
    module.Model = Model
    sys.modules["bench_upstream"] = module
    model = Model()
    original = Model.__dict__["forward"]
    Model.forward = replacement  # the same replacement installed by hand: the baseline
    direct_ns = best_ns("model.forward(1)", {"model": model})
    Model.forward = original

    for_replace = engine_with(Replace("bench_upstream:Model.forward", replacement))
    for_replace.apply_all()
    replaced_ns = best_ns("model.forward(1)", {"model": model})
    for_replace.revert_all()

    for_wrap = engine_with(Wrap("bench_upstream:Model.forward", delegate))
    for_wrap.apply_all()
    wrapped_ns = best_ns("model.forward(1)", {"model": model})
    for_wrap.revert_all()

    def wrapper(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + 1

    Model.forward = wrapt.FunctionWrapper(Model.__dict__["forward"], wrapper)
    wrapt_ns = best_ns("model.forward(1)", {"model": model})

    sys.stdout.write(
        f"per call, best of {REPEATS}x{CALLS}: replacement installed by hand {direct_ns:.0f} ns; "
        f"patchkit Replace {replaced_ns:.0f} ns ({replaced_ns - direct_ns:+.0f} ns, "
        f"ratio {replaced_ns / direct_ns:.2f}x); "
        f"patchkit Wrap closure {wrapped_ns:.0f} ns ({wrapped_ns - direct_ns:+.0f} ns); "
        f"wrapt FunctionWrapper {wrapt_ns:.0f} ns ({wrapt_ns - direct_ns:+.0f} ns)\n"
    )


if __name__ == "__main__":
    main()
