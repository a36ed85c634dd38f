"""The consistency check on manifests it is handed: majority reference, what counts as a
difference, strict mode, files and the command line. Cross-process proofs are in the other modules."""

from __future__ import annotations

import json

import pytest

from patchkit import PatchStatus, Reason, State
from patchkit.processes.consistency import EXIT_UNREADABLE, ManifestMismatchError, check, check_files, compare, main
from patchkit.processes.manifest import FINGERPRINTERS, Manifest, ManifestError, collect

APPLIED = PatchStatus("toy.forward", State.APPLIED, variant="v1", versions={"pkproc-toy": "1.0.0"})
PENDING = PatchStatus("toy.forward", State.PENDING, variant="v1", versions={"pkproc-toy": "1.0.0"})
DISABLED = PatchStatus("toy.forward", State.SKIPPED, Reason.DISABLED, "disabled by PATCHKIT_DISABLE",
                       variant=None, versions={"pkproc-toy": "1.0.0"})
OTHER = PatchStatus("toy.other", State.APPLIED, variant="v1", versions={"pkproc-toy": "1.0.0"})


def ranks(*records_per_rank):
    return [collect(list(records), rank=rank) for rank, records in enumerate(records_per_rank)]


def test_identical_manifests_pass():
    report = compare(ranks([APPLIED, OTHER], [APPLIED, OTHER], [APPLIED, OTHER]))
    assert report.ok and report.differences == ()


def test_the_odd_rank_out_is_named_with_the_patch_and_each_differing_field():
    report = compare(ranks([APPLIED], [APPLIED], [DISABLED], [APPLIED]))
    assert report.differing_processes() == ["rank 2"] and report.differing_patches() == ["toy.forward"]
    fields = {d.field: (d.expected, d.found) for d in report.differences}
    assert fields == {"state": ("applied", "skipped"), "reason": (None, "disabled"), "variant": ("v1", None)}
    expected = "rank 2: toy.forward: state 'skipped', the others 'applied' (disabled by PATCHKIT_DISABLE)"
    assert expected in report.render()


def test_when_rank_zero_is_the_odd_one_out_it_is_rank_zero_that_is_named():
    report = compare(ranks([DISABLED], [APPLIED], [APPLIED]))
    assert report.differing_processes() == ["rank 0"]


def test_a_tie_takes_the_lowest_rank_as_reference():
    assert compare(ranks([APPLIED], [DISABLED])).differing_processes() == ["rank 1"]


def test_a_patch_missing_from_a_process_is_a_presence_difference():
    report = compare(ranks([APPLIED, OTHER], [APPLIED], [APPLIED, OTHER]))
    (difference,) = report.differences
    assert (difference.process, difference.patch_id, difference.field, difference.found) == \
        ("rank 1", "toy.other", "presence", "absent")


def test_pending_agrees_with_applied_unless_exact():
    manifests = ranks([APPLIED], [PENDING])
    assert compare(manifests).ok
    assert [d.field for d in compare(manifests, exact=True).differences] == ["state"]


def test_differing_upstream_versions_are_a_difference():
    older = PatchStatus("toy.forward", State.APPLIED, variant="v1", versions={"pkproc-toy": "0.9.0"})
    (difference,) = compare(ranks([APPLIED], [APPLIED], [older])).differences
    assert (difference.field, difference.expected, difference.found) == \
        ("versions", {"pkproc-toy": "1.0.0"}, {"pkproc-toy": "0.9.0"})


def test_fingerprints_registered_by_an_extension_are_compared(monkeypatch):
    values = iter(["aaa", "aaa", "bbb"])
    monkeypatch.setattr("patchkit.processes.manifest.FINGERPRINTERS", [lambda record: {"code": next(values)}])
    manifests = ranks([APPLIED], [APPLIED], [APPLIED])
    assert FINGERPRINTERS == []  # the extension point starts empty
    (difference,) = compare(manifests).differences
    assert (difference.process, difference.field) == ("rank 2", "fingerprints")


def test_strict_raises_with_the_report_and_logs_it(caplog):
    manifests = ranks([APPLIED], [DISABLED])
    with pytest.raises(ManifestMismatchError, match="rank 1: toy.forward") as raised:
        check(manifests, strict=True)
    assert raised.value.report.differing_processes() == ["rank 1"]
    assert "patch mismatch" in caplog.text


def test_strict_follows_patchkit_strict(monkeypatch):
    monkeypatch.setenv("PATCHKIT_STRICT", "1")
    with pytest.raises(ManifestMismatchError):
        check(ranks([APPLIED], [DISABLED]))
    monkeypatch.setenv("PATCHKIT_STRICT", "0")
    assert not check(ranks([APPLIED], [DISABLED])).ok


def test_manifests_round_trip_through_files_and_the_command_line(tmp_path, capsys):
    manifests = ranks([APPLIED], [APPLIED], [DISABLED])
    for manifest in manifests:
        manifest.write(tmp_path / "manifests" / f"rank{manifest.rank}.json")
    assert Manifest.read(tmp_path / "manifests" / "rank2.json") == manifests[2]
    report = check_files([tmp_path / "manifests"], report_path=tmp_path / "report.json")
    assert report.differing_processes() == ["rank 2"]
    assert json.loads((tmp_path / "report.json").read_text())["differing_processes"] == ["rank 2"]
    assert main([str(tmp_path / "manifests")]) == 1
    (tmp_path / "manifests" / "rank2.json").unlink()
    assert main([str(tmp_path / "manifests")]) == 0


def test_a_manifest_of_another_schema_is_refused():
    data = ranks([APPLIED])[0].to_dict()
    data["schema"] = 99
    with pytest.raises(ValueError, match="schema 99"):
        Manifest.from_dict(data)


def test_pending_although_its_module_is_imported_is_a_difference_named_as_such():
    # "json" stands for a target module this process has imported: the patch will never install.
    stuck = PatchStatus("toy.forward", State.PENDING, variant="v1", versions={"pkproc-toy": "1.0.0"},
                        waiting_for=("json",))
    waiting = PatchStatus("toy.forward", State.PENDING, variant="v1", versions={"pkproc-toy": "1.0.0"},
                          waiting_for=("pkproc_toy_never_imported.core",))
    assert compare(ranks([APPLIED], [waiting])).ok  # not imported there yet: installs at that import
    report = compare(ranks([APPLIED], [APPLIED], [stuck]))
    (difference,) = report.differences
    assert (difference.process, difference.field, difference.found) == ("rank 2", "state", "pending")
    assert "pending although json is imported in this process" in report.render()
    # ...and it survives the trip through a manifest file.
    data = ranks([stuck])[0].to_dict()
    assert Manifest.from_dict(data).entries[0].imported_while_pending == ("json",)


@pytest.mark.parametrize(("content", "problem"), [
    ('{"schema": 1, "patches": [', "invalid JSON at line 1"),
    ("", "empty"),
    ("[1, 2]", "expected a JSON object, found list"),
    ('{"schema": 1, "process": {}}', "expected 'patches'"),
    ('{"schema": 1, "patches": [{"state": "applied"}]}', "expected 'patches'"),
    ('{"schema": 7, "patches": []}', "schema 7"),
])
def test_a_bad_manifest_in_a_folder_is_named_with_its_own_exit_status(tmp_path, caplog, content, problem):
    folder = tmp_path / "manifests"
    ranks([APPLIED])[0].write(folder / "good.json")
    (folder / "bad.json").write_text(content)
    with pytest.raises(ManifestError) as raised:
        check_files([folder])
    assert raised.value.path == str(folder / "bad.json") and problem in str(raised.value)
    assert main([str(folder)]) == EXIT_UNREADABLE == 2
    assert str(folder / "bad.json") in caplog.text and problem in caplog.text


def test_no_manifest_files_is_the_unreadable_exit_status(tmp_path):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == EXIT_UNREADABLE
