"""`patchkit matrix merge`: what `matrix check` would reject is refused and nothing is written; a record
contradicting a recorded fingerprint is refused; merging is linear in the number of records."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from patchkit import Patch, Replace, Variant
from patchkit.cli import main
from patchkit.matrix.check import check
from patchkit.matrix.merge import MergeError, merge_contribution
from patchkit.matrix.schema import parse
from patchkit.runtime.catalogue import Registered

TARGET = "up.core:Model.forward"
OLD = Variant({"up": ">=1.0,<2.0"}, (Replace(TARGET, "x:y"),), label="old")
NEW = Variant({"up": ">=2.0"}, native="upstream has it from 2.0", label="new")
REGISTRY = [Registered(Patch(id="up.feature", summary="s", why="w", upstream="u", removal="r",
                             variants=(OLD, NEW)), None)]

OURS = """schema: 1
environments:
  ci:
    install: []
    tests: [t]
patches:
  up.feature:
    old:
      - versions: {up: '1.5.0'}
        status: verified
        verified_by: ['tests:ci']
        targets:
          'up.core:Model.forward': {fingerprint: 0123456789abcdef, signature: '(self, x)'}
    new:
      - versions: {up: '2.1.0'}
        status: native
"""


def contribution(records: str, patch: str = "up.feature", variant: str = "old") -> str:
    return f"schema: 1\nenvironments: {{}}\npatches:\n  {patch}:\n    {variant}:\n{records}"


def record(version: str, fingerprint: str = "0123456789abcdef", status: str = "verified",
           source: str = "doctor:node") -> str:
    return (f"      - versions: {{up: '{version}'}}\n        status: {status}\n        verified_by: ['{source}']\n"
            f"        targets:\n          '{TARGET}': {{fingerprint: {fingerprint}}}\n")


def merge(theirs: str) -> list[tuple[str, tuple[str, ...], str | None]]:
    merged = merge_contribution(parse(OURS, "ours.yaml"), parse(theirs, "theirs.yaml"), REGISTRY)
    assert [str(d) for d in check(merged, REGISTRY)] == []
    return [(r.versions["up"], r.verified_by, r.targets[TARGET].fingerprint)
            for r in merged.patches["up.feature"]["old"]]


def test_a_record_of_a_new_release_is_added_and_the_same_release_gains_a_source() -> None:
    assert merge(contribution(record("1.5.0") + record("1.6.0"))) == [
        ("1.5.0", ("doctor:node", "tests:ci"), "0123456789abcdef"), ("1.6.0", ("doctor:node",), "0123456789abcdef")]


@pytest.mark.parametrize(("theirs", "named"), [
    (contribution(record("1.6.0"), patch="up.unknown"), "no such patch is registered"),
    (contribution(record("1.6.0"), variant="later"), "declares no such variant"),
    (contribution(record("2.5.0")), "does not cover up 2.5.0, recorded as verified"),
    (contribution(record("1.6.0", status="known-bad")), "covers up 1.6.0, recorded as known-bad"),
    (contribution(record("1.6.0", source="tests:elsewhere")), "environment 'elsewhere'"),
    (contribution(record("1.6.0").replace("Model.forward", "Model.backward")), "variant 'old' does not patch it"),
], ids=["unknown-patch", "unknown-variant", "out-of-range", "in-range-known-bad", "unknown-env", "unknown-target"])
def test_a_record_matrix_check_would_reject_is_refused_naming_it(theirs: str, named: str) -> None:
    with pytest.raises(MergeError, match=named) as refused:
        merge(theirs)
    assert "theirs.yaml:" in str(refused.value) and "nothing was merged" in str(refused.value)


def test_a_record_contradicting_a_ci_verified_fingerprint_is_refused() -> None:
    """Before, it replaced the fingerprint while tests:ci stayed listed as a verifier of it."""
    with pytest.raises(MergeError, match=r"fingerprint 'fedcba9876543210' contradicts the recorded "
                                         r"'0123456789abcdef' \(verified by tests:ci\)"):
        merge(contribution(record("1.5.0", fingerprint="fedcba9876543210")))


def test_a_record_with_another_status_for_a_recorded_release_is_refused() -> None:
    with pytest.raises(MergeError, match="status 'native' contradicts the recorded 'verified'"):
        merge(contribution(record("1.5.0", status="native")))


def test_the_command_refuses_with_exit_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import patchkit.matrix.cli as matrix_cli

    monkeypatch.setattr(matrix_cli, "_registry", lambda: REGISTRY)
    ours, theirs = tmp_path / "compat_matrix.yaml", tmp_path / "doctor.yaml"
    ours.write_text(OURS)
    theirs.write_text(contribution(record("1.6.0") + record("2.5.0")))
    assert main(["matrix", "merge", "--matrix", str(ours), str(theirs)]) == 2
    err = capsys.readouterr().err
    assert "patchkit:" in err and "up 2.5.0" in err and "Traceback" not in err
    assert ours.read_text() == OURS  # the good record of 1.6.0 was not merged either
    theirs.write_text(contribution(record("1.6.0")))
    assert main(["matrix", "merge", "--matrix", str(ours), str(theirs)]) == 0
    assert '"1.6.0"' in ours.read_text()


def test_merging_is_linear_in_the_number_of_records() -> None:
    """Before, each record copied every record merged so far: 8k records took 17 s, 40k over 300 s."""
    one = parse(contribution(record("1.5.0")), "theirs.yaml").patches["up.feature"]["old"][0]

    def timed(n: int) -> float:
        records = tuple(dataclasses.replace(one, versions={"up": f"1.5.{i}"}) for i in range(n))
        theirs = dataclasses.replace(parse(contribution(record("1.5.0")), "theirs.yaml"),
                                     patches={"up.feature": {"old": records}})
        ours = parse(OURS, "ours.yaml")
        started = time.perf_counter()
        merged = merge_contribution(ours, theirs, REGISTRY)
        elapsed = time.perf_counter() - started
        assert len(merged.patches["up.feature"]["old"]) == n  # 1.5.0 was there already
        return elapsed

    # Bounds for a loaded 2-core machine: quadratic, 40k records take minutes (100x the 4k time).
    # The best of a few runs: on a shared machine one run can stall for seconds.
    small, large = min(timed(4_000) for _ in range(3)), min(timed(40_000) for _ in range(2))
    assert large < 20, f"40k records took {large:.1f} s"
    assert large < 40 * small + 2, f"4k: {small:.2f} s, 40k: {large:.2f} s: not linear"
