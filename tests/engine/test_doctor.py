"""`patchkit doctor` on toy upstreams: each verdict, the time limit, bad input, and the records it writes.

The real patches' self-checks are proven in their own environments (tests/megatron, tests/modelopt,
tests/bridge, tests/vllm), each with a broken-replacement twin; these tests pin the runner itself.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from patchkit import Patch, Replace, Variant
from patchkit.doctor import FAILED, NEEDS_GPU, NOT_APPLICABLE, VERIFIED, exit_status, run
from patchkit.doctor.record import write_records
from patchkit.matrix.schema import parse
from patchkit.runtime.errors import UnknownPatchError
from patchkit.selfcheck import CheckContext, expect

IMPLEMENTATION = {"forward": lambda self, x: x + 1000}


def patched_forward(self, x):
    return IMPLEMENTATION["forward"](self, x)


def forward_adds_1000(context: CheckContext) -> None:
    import importlib

    core = importlib.import_module(CURRENT["core"])
    found = core.Model().forward(1)
    expect(found == 1001, "Model.forward(1) adds 1000", 1001, found)


def hangs(context: CheckContext) -> None:
    time.sleep(30)


def raises(context: CheckContext) -> None:
    raise KeyError("no such layer")


def gpu_only(context: CheckContext) -> None:
    context.require_cuda()


CURRENT: dict[str, str] = {}


def toy_patch(up, patch_id: str, check, requires: str = ">=1") -> Patch:
    return Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r", self_check=check,
                 variants=(Variant(requires={up.name: requires},
                                   installs=(Replace(up.target("Model.forward"), patched_forward),)),))


@pytest.fixture
def toy(engine, make_upstream, monkeypatch):
    up = make_upstream()
    CURRENT["core"] = up.core
    monkeypatch.setitem(IMPLEMENTATION, "forward", lambda self, x: x + 1000)
    return engine, up


def verdicts_by_id(verdicts):
    return {v.id: v for v in verdicts}


def test_an_applied_patch_whose_check_holds_is_verified(toy):
    engine, up = toy
    engine.register(toy_patch(up, "toy.forward", forward_adds_1000))
    verdicts, facts = run(engine=engine, device="cpu")
    (verdict,) = verdicts
    assert (verdict.verdict, verdict.status.state.value) == (VERIFIED, "applied")
    assert exit_status(verdicts) == 0 and facts["device"] == "cpu"


def test_a_replacement_behaving_like_upstream_is_failed_with_expected_and_found(toy, monkeypatch):
    engine, up = toy
    engine.register(toy_patch(up, "toy.forward", forward_adds_1000))
    monkeypatch.setitem(IMPLEMENTATION, "forward", lambda self, x: x + 1)  # upstream's behaviour
    verdicts, _ = run(engine=engine, device="cpu")
    assert verdicts[0].verdict == FAILED
    assert verdicts[0].message == "Model.forward(1) adds 1000: expected 1001, found 2"
    assert exit_status(verdicts) == 1


def test_a_check_that_raises_or_hangs_fails_and_the_others_still_run(toy):
    engine, up = toy
    engine.register(toy_patch(up, "toy.a_hangs", hangs))
    engine.register(toy_patch(up, "toy.b_raises", raises))
    engine.register(toy_patch(up, "toy.c_works", forward_adds_1000))
    started = time.perf_counter()
    found = verdicts_by_id(run(engine=engine, device="cpu", timeout=0.5)[0])
    assert time.perf_counter() - started < 10
    assert found["toy.a_hangs"].verdict == FAILED and "did not finish within 0.5 s" in found["toy.a_hangs"].message
    assert found["toy.b_raises"].verdict == FAILED
    assert "KeyError: 'no such layer'" in found["toy.b_raises"].message
    assert found["toy.c_works"].verdict == VERIFIED


def test_gpu_only_checks_on_the_cpu_and_patches_that_do_not_apply_are_not_failures(toy):
    engine, up = toy
    engine.register(toy_patch(up, "toy.gpu", gpu_only))
    engine.register(toy_patch(up, "toy.future", forward_adds_1000, requires=">=99"))
    engine.register(toy_patch(up, "toy.unchecked", None))
    found = verdicts_by_id(run(engine=engine, device="cpu")[0])
    assert found["toy.gpu"].verdict == NEEDS_GPU
    assert found["toy.future"].verdict == NOT_APPLICABLE and "unsupported_version" in found["toy.future"].message
    assert found["toy.unchecked"].verdict == NOT_APPLICABLE
    assert found["toy.unchecked"].message == "the patch declares no self-check"
    assert exit_status(found.values()) == 0


def test_an_unknown_patch_glob_names_the_closest_ids(toy):
    engine, up = toy
    engine.register(toy_patch(up, "toy.forward", forward_adds_1000))
    with pytest.raises(UnknownPatchError, match="did you mean toy.forward"):
        run(["toy.forwrd"], engine=engine, device="cpu")


def test_recorded_verdicts_form_a_matrix_document_with_a_doctor_source(toy, tmp_path, monkeypatch):
    engine, up = toy
    engine.register(toy_patch(up, "toy.forward", forward_adds_1000))
    verdicts, _ = run(engine=engine, device="cpu")
    monkeypatch.setattr("patchkit.engine", lambda: engine)
    out = tmp_path / "mine.yaml"
    assert write_records(out, verdicts, label="doctor:gpu-node-7") == 1
    matrix = parse(out.read_text(), str(out))
    (record,) = matrix.patches["toy.forward"][f"{up.name}>=1"]
    assert record.verified_by == ("doctor:gpu-node-7",) and record.versions == {up.name: "1.2.3"}
    assert record.targets[up.target("Model.forward")].fingerprint


def test_the_command_reports_every_patch_and_exits_2_on_an_unknown_glob():
    command = [sys.executable, "-m", "patchkit", "doctor"]
    listing = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "doctor:" in listing.stdout.splitlines()[-1]
    unknown = subprocess.run(command + ["--patch", "megatron.mtp_postproces"], capture_output=True, text=True,
                             timeout=120)
    assert unknown.returncode == 2 and "did you mean megatron.mtp_postprocess" in unknown.stderr


def test_matrix_merge_adds_a_contributed_record_and_unions_sources_of_the_same_versions():
    from patchkit.matrix.merge import merge_contribution

    head = "schema: 1\nenvironments:\n  e:\n    install: []\n    tests: [t]\npatches:\n  toy.forward:\n    v:\n"
    ours = parse(head + "      - versions: {toy: '1.0'}\n        status: verified\n        verified_by: [tests:e]\n",
                 "ours.yaml")
    theirs = parse("schema: 1\nenvironments: {}\npatches:\n  toy.forward:\n    v:\n"
                   "      - versions: {toy: '1.0'}\n        status: verified\n        verified_by: [doctor:node]\n"
                   "      - versions: {toy: '2.0'}\n        status: verified\n        verified_by: [doctor:node]\n",
                   "theirs.yaml")
    merged = merge_contribution(ours, theirs).patches["toy.forward"]["v"]
    assert [(r.versions["toy"], r.verified_by) for r in merged] == [
        ("1.0", ("doctor:node", "tests:e")), ("2.0", ("doctor:node",))]


SEEN_THREADS: list[int] = []


def records_torch_threads(context: CheckContext) -> None:
    import torch

    SEEN_THREADS.append(torch.get_num_threads())


def test_checks_run_on_one_torch_thread_and_the_setting_comes_back(toy):
    torch = pytest.importorskip("torch")
    engine, up = toy
    engine.register(toy_patch(up, "toy.threads", records_torch_threads))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        SEEN_THREADS.clear()
        (verdict,), _ = run(engine=engine, device="cpu")
        assert verdict.verdict == VERIFIED and SEEN_THREADS == [1]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_the_command_ends_its_process_after_the_report_with_exit_handlers_run_and_output_whole():
    # The entry point skips interpreter teardown (seconds with torch and megatron-core loaded), but
    # exit handlers still run, the report is complete and the exit status is the doctor's.
    script = ("import atexit, sys; atexit.register(lambda: sys.stderr.write('exit handler ran\\n')); "
              "sys.argv = ['patchkit', 'doctor', '--json', '--patch', 'bridge.*']; "
              "from patchkit.cli import main; sys.exit(main())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exit handler ran" in done.stderr
    import json

    assert {p["id"].split(".")[0] for p in json.loads(done.stdout)["patches"]} == {"bridge"}


def test_the_command_called_with_arguments_returns_to_its_caller(monkeypatch, capsys):
    from patchkit.cli import main

    monkeypatch.setattr("os._exit", lambda status: pytest.fail(f"os._exit({status}) from an in-process call"))
    assert main(["doctor", "--json", "--patch", "bridge.*"]) == 0
    assert '"patches"' in capsys.readouterr().out
