"""``multiprocessing`` with the spawn start method: a fresh interpreter per child, as torch's
DataLoader workers and many RL frameworks' rollout workers are started."""

from __future__ import annotations

import json
import textwrap

from procs_toy import AUTOLOAD, TOY_PATCHES

PARENT = textwrap.dedent("""
    import json, multiprocessing as mp, sys
    import patchkit.processes.autoload
    from patchkit.processes.consistency import compare
    from patchkit.processes.manifest import Manifest, collect


    def child_manifest(queue):
        from pkproc_toy.core import Model
        queue.put((Model().forward(1), collect().to_dict()))


    def named(manifest, name):
        return Manifest(manifest.entries, {**manifest.process, "name": name}, manifest.autoload)


    if __name__ == "__main__":
        if sys.argv[1] == "explicit":
            patchkit.processes.autoload.load()  # the parent applies in code; nothing tells its children to
        from pkproc_toy.core import Model
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=child_manifest, args=(queue,))
        child.start()
        child_forward, child_data = queue.get(timeout=120)
        child.join(timeout=120)
        report = compare([named(collect(), "parent"), named(Manifest.from_dict(child_data), "child")])
        sys.stdout.write(json.dumps({"forward": [Model().forward(1), child_forward], "report": report.to_dict()}))
""")


def run_parent(toy, tmp_path, mode, **variables):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    result = toy.python(f"import runpy, sys; sys.argv = ['parent.py', {mode!r}]; "
                        f"runpy.run_path({str(script)!r}, run_name='__main__')", **variables)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_spawned_child_with_autoload_has_the_parents_manifest(toy, tmp_path):
    seen = run_parent(toy, tmp_path, "autoload", **AUTOLOAD)
    assert seen["forward"] == [1001, 1001]
    assert seen["report"]["ok"], seen["report"]["text"]


def test_spawned_child_without_autoload_is_reported_as_missing_the_patch(toy, tmp_path):
    seen = run_parent(toy, tmp_path, "explicit", **TOY_PATCHES)
    assert seen["forward"] == [1001, 2]
    report = seen["report"]
    assert report["differing_processes"] == ["child"]
    found = [(d["process"], d["patch"], d["field"], d["found"]) for d in report["differences"]]
    assert ("child", "toy.forward", "presence", "absent") in found
    # The child never ran apply_all: catalogue patches the parent skipped are only 'registered' there.
    assert {state for _, patch, field, state in found if field == "state"} <= {"registered"}
