"""A real two-rank ``torch.distributed`` job on gloo, started by torchrun under ``patchkit run``.

Each rank is a fresh interpreter that autoloads through the installed hook. A per-rank variable
can only come from the command torchrun starts, so the ranks are started through a two-line
shell wrapper (``torchrun --no-python``) that sets ``PATCHKIT_DISABLE`` on one local rank.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from _multiprocess import run_rank_commands
from procs_toy import TOY_PATCHES

pytest.importorskip("torch.distributed")

RANK = textwrap.dedent("""
    import json, os, sys
    import torch.distributed as dist
    from patchkit.processes.consistency import ManifestMismatchError, check_distributed
    from pkproc_toy.core import Model

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    report = check_distributed(report_path=os.path.join(out, f"report-written-by-rank{rank}.json"))
    try:
        check_distributed(strict=True)
        strict = "passed"
    except ManifestMismatchError as exc:
        strict = "raised: " + str(exc).splitlines()[0]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"forward": Model().forward(1), "report": report.to_dict(), "strict": strict}, f)
    dist.destroy_process_group()
""")

WRAPPER = """\
[ "$LOCAL_RANK" = "$PKPROC_DISABLE_ON_RANK" ] && export PATCHKIT_DISABLE=toy.forward
exec "$PKPROC_PYTHON" "$PKPROC_RANK_SCRIPT" "$@"
"""


def torchrun(toy, tmp_path, disable_on_rank: str = "") -> dict:
    (tmp_path / "rank.py").write_text(RANK)
    (tmp_path / "rank.sh").write_text(WRAPPER)
    out = tmp_path / "out"
    out.mkdir()
    command = [sys.executable, "-m", "patchkit", "run", "--",
               sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--no-python", "sh", str(tmp_path / "rank.sh"), str(out)]
    env = toy.env(PKPROC_PYTHON=sys.executable, PKPROC_RANK_SCRIPT=str(tmp_path / "rank.py"),
                  PKPROC_DISABLE_ON_RANK=disable_on_rank, OMP_NUM_THREADS="1", **TOY_PATCHES)
    # torchrun in a session of its own, killed with its ranks if it fails or runs past the deadline.
    run_rank_commands([command], timeout=240, env=env, cwd=tmp_path)
    return {"ranks": [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)],
            "reports": sorted(p.name for p in out.glob("report-*.json")),
            "rank0_report": json.loads((out / "report-written-by-rank0.json").read_text())}


def test_both_ranks_autoload_and_the_all_gather_check_passes(toy, tmp_path):
    seen = torchrun(toy, tmp_path)
    assert [rank["forward"] for rank in seen["ranks"]] == [1001, 1001]
    assert all(rank["report"]["ok"] and rank["strict"] == "passed" for rank in seen["ranks"])
    assert seen["reports"] == ["report-written-by-rank0.json"]  # written once, by rank 0
    assert seen["rank0_report"]["processes"] == ["rank 0", "rank 1"]


def test_a_rank_with_the_patch_disabled_is_named_with_the_patch(toy, tmp_path):
    seen = torchrun(toy, tmp_path, disable_on_rank="1")
    assert [rank["forward"] for rank in seen["ranks"]] == [1001, 2]
    report = seen["rank0_report"]
    assert report["differing_processes"] == ["rank 1"]
    found = [(d["process"], d["patch"], d["field"], d["found"]) for d in report["differences"]]
    assert ("rank 1", "toy.forward", "state", "skipped") in found
    assert ("rank 1", "toy.forward", "reason", "disabled") in found
    assert "rank 1: toy.forward: state 'skipped', the others 'applied' (disabled by PATCHKIT_DISABLE)" in report["text"]
    # Every rank got the same report, and in strict mode every rank raised: none is left hanging.
    assert seen["ranks"][1]["report"] == seen["ranks"][0]["report"]
    assert all(rank["strict"].startswith("raised: patchkit: patch mismatch") for rank in seen["ranks"])
    assert seen["reports"] == ["report-written-by-rank0.json"]
