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

CALLS = 1_000_000
ROUNDS = 9


class Model:
    def forward(self, x):
        return x


def replacement(self, x):
    return x + 1


def delegate(original):
    def forward(self, x):
        return original(self, x) + 1

    return forward


def per_call_ns(model: Model) -> float:
    return timeit.Timer("model.forward(1)", globals={"model": model}).timeit(number=CALLS) / CALLS * 1e9


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
    for_replace = engine_with(Replace("bench_upstream:Model.forward", replacement))
    for_wrap = engine_with(Wrap("bench_upstream:Model.forward", delegate))

    def wrapper(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) + 1

    def by_hand() -> None:  # the same replacement installed by hand: the baseline
        Model.forward = replacement

    def through_wrapt() -> None:
        Model.forward = wrapt.FunctionWrapper(original, wrapper)

    def restore() -> None:
        Model.forward = original

    kinds = {
        "by hand": (by_hand, restore),
        "patchkit Replace": (for_replace.apply_all, for_replace.revert_all),
        "patchkit Wrap closure": (for_wrap.apply_all, for_wrap.revert_all),
        "wrapt FunctionWrapper": (through_wrapt, restore),
    }
    best = {kind: float("inf") for kind in kinds}
    for _ in range(ROUNDS):  # interleaved, so load on a shared machine hits every kind alike
        for kind, (install, uninstall) in kinds.items():
            install()
            best[kind] = min(best[kind], per_call_ns(model))
            uninstall()
    base = best["by hand"]
    figures = "; ".join(f"{kind} {ns:.0f} ns ({ns - base:+.0f} ns, {ns / base:.2f}x)" for kind, ns in best.items())
    sys.stdout.write(f"per call, best of {ROUNDS} interleaved rounds of {CALLS}: {figures}\n")


if __name__ == "__main__":
    main()
