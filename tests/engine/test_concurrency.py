"""Many threads applying and reverting at once end in a state that matches what is installed."""

from __future__ import annotations

import random
import threading

from patchkit import Patch, Replace, State, Variant


def forward(self, x):
    return "patched forward"


def compute(x):
    return "patched compute"


def test_sixteen_threads_apply_and_revert_end_consistent(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    originals = {"forward": core.Model.__dict__["forward"], "compute": core.compute}
    engine.register(Patch(id="toy.a", summary="s", why="w", upstream="u", removal="r",
                          variants=(Variant(requires={up.name: ">=1"}, installs=(
                              Replace(up.target("Model.forward"), forward), Replace(up.target("compute"), compute))),)))
    start = threading.Barrier(16)
    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        try:
            for _ in range(200):
                engine.apply_all() if rng.random() < 0.5 else engine.revert_all()
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    (record,) = engine.status()
    installed = (core.Model.__dict__["forward"], core.compute)
    if record.state is State.APPLIED:
        assert installed == (forward, compute)
    else:
        assert record.state is State.REVERTED
        assert installed == (originals["forward"], originals["compute"])
    engine.apply_all()
    engine.revert_all()
    assert (core.Model.__dict__["forward"], core.compute) == (originals["forward"], originals["compute"])
