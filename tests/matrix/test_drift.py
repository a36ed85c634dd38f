"""Drift at install time, on real installed distributions whose target code was changed."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from patchkit import Engine, Patch, Reason, Replace, State, Variant
from patchkit.matrix import MatrixError
from patchkit.matrix.index import source
from patchkit.matrix.record import record
from patchkit.matrix.schema import parse
from patchkit.matrix.writer import replace_patches
from patchkit.runtime.catalogue import Registered
from patchkit.runtime.errors import DriftError

from .conftest import SOURCE, Dist

MATRIX = """schema: 1
environments:
  toy:
    install: []
    tests: [tests/matrix]
"""


def forward_plus_two(self, x):
    return x + 2


def _patch(dist: Dist) -> Patch:
    return Patch(
        id="toy.forward", summary="s", why="w", upstream="u", removal="r",
        variants=(Variant({dist.name: ">=1.0,<2"}, (Replace(dist.target("Model.forward"), forward_plus_two),)),),
    )


def _recorded_matrix(dist: Dist, tmp_path: Path) -> Path:
    """The matrix as `patchkit matrix record --env toy` would write it against ``dist``."""
    matrix = record(parse(MATRIX), [Registered(_patch(dist), None)], "toy")
    path = tmp_path / "compat_matrix.yaml"
    path.write_text(replace_patches(MATRIX, matrix.patches))
    return path


def _apply(dist: Dist, matrix: Path | None, **kwargs) -> tuple[Engine, object]:
    engine = Engine([Registered(_patch(dist), None)], matrix=None if matrix is None else source(matrix))
    __import__(dist.core)
    (status,) = engine.apply_all(**kwargs)
    return engine, status


def test_changed_target_body_is_applied_as_drifted_with_a_warning(make_dist, tmp_path, caplog) -> None:
    original = make_dist()
    matrix = _recorded_matrix(original, tmp_path)
    changed = make_dist(like=original, source=SOURCE.replace("return x + 1", "return x + 100"))
    with caplog.at_level(logging.WARNING, logger="patchkit"):
        engine, status = _apply(changed, matrix)
    try:
        assert status.state is State.APPLIED and status.reason is Reason.DRIFTED
        assert changed.target("Model.forward") in status.detail and f"{original.name} 1.2.3" in status.detail
        assert sys.modules[changed.core].Model().forward(1) == 3
        assert any("drifted" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    finally:
        engine.revert_all()
    assert sys.modules[changed.core].Model().forward(1) == 101


def test_strict_mode_refuses_a_drifted_variant_and_installs_nothing(make_dist, tmp_path) -> None:
    original = make_dist()
    matrix = _recorded_matrix(original, tmp_path)
    changed = make_dist(like=original, source=SOURCE.replace("return x + 1", "return x * 1"))
    engine = Engine([Registered(_patch(changed), None)], matrix=source(matrix))
    module = __import__(changed.core, fromlist=["Model"])
    with pytest.raises(DriftError) as caught:
        engine.apply_all(strict=True)
    assert caught.value.targets == (changed.target("Model.forward"),)
    assert caught.value.compared == (f"{original.name} 1.2.3",)
    assert module.Model().forward(3) == 3
    assert not engine.status()[0].state.installed


def test_docstring_and_comment_changes_are_not_drift(make_dist, tmp_path) -> None:
    original = make_dist()
    matrix = _recorded_matrix(original, tmp_path)
    redocumented = SOURCE.replace('"""Add one."""', '"""Add one, as documented elsewhere."""  # note')
    changed = make_dist(like=original, source=redocumented.replace("return x + 1", "return (x\n                + 1)"))
    engine, status = _apply(changed, matrix, strict=True)
    try:
        assert status.state is State.APPLIED and status.reason is None
    finally:
        engine.revert_all()


def test_the_unchanged_upstream_is_not_drifted(make_dist, tmp_path) -> None:
    original = make_dist()
    engine, status = _apply(original, _recorded_matrix(original, tmp_path), strict=True)
    engine.revert_all()
    assert status.state is State.APPLIED and status.reason is None


def test_a_variant_without_recorded_fingerprints_is_unknown_not_drifted(make_dist, tmp_path) -> None:
    dist = make_dist(source=SOURCE.replace("return x + 1", "return x + 5"))
    path = tmp_path / "compat_matrix.yaml"
    path.write_text(MATRIX)
    engine, status = _apply(dist, path, strict=True)
    engine.revert_all()
    assert status.state is State.APPLIED and status.reason is None


def test_the_installed_release_recorded_without_fingerprints_is_unknown_not_drifted(
    make_dist, tmp_path
) -> None:
    # 1.2.3 was recorded with fingerprints; the installed 1.5.0 has changed code and a record of its
    # own without them (its environment could not read the target): unknown, not drift against 1.2.3.
    original = make_dist(version="1.2.3")
    matrix_path = _recorded_matrix(original, tmp_path)
    changed = make_dist(like=original, version="1.5.0", source=SOURCE.replace("return x + 1", "return x + 9"))
    text = matrix_path.read_text()
    own = (f'      - versions: {{{changed.name}: "1.5.0"}}\n'
           '        status: verified\n        verified_by: ["tests:toy"]\n')
    marker = "# --- end of generated patches ---"
    assert marker in text
    matrix_path.write_text(text.replace(marker, own + marker))
    engine, status = _apply(changed, matrix_path, strict=True)
    engine.revert_all()
    assert status.state is State.APPLIED and status.reason is None


def test_records_outside_the_installed_range_are_not_compared(make_dist, tmp_path) -> None:
    original = make_dist(version="1.2.3")
    matrix_path = _recorded_matrix(original, tmp_path)
    text = matrix_path.read_text().replace('"1.2.3"', '"2.5.0"')  # the record now lies outside >=1.0,<2
    matrix_path.write_text(text)
    changed = make_dist(like=original, source=SOURCE.replace("return x + 1", "return x + 9"))
    engine, status = _apply(changed, matrix_path, strict=True)
    engine.revert_all()
    assert status.state is State.APPLIED and status.reason is None


def test_a_malformed_matrix_is_logged_by_default_and_raised_in_strict_mode(make_dist, tmp_path, caplog) -> None:
    dist = make_dist()
    bad = tmp_path / "compat_matrix.yaml"
    bad.write_text("schema: 1\nenvironments: {e: {install: [], tests: []}}\n")
    with caplog.at_level(logging.ERROR, logger="patchkit"):
        engine, status = _apply(dist, bad)
    engine.revert_all()
    assert status.state is State.APPLIED
    assert any("malformed" in r.getMessage() for r in caplog.records)
    with pytest.raises(MatrixError, match=r"compat_matrix.yaml:2:\d+"):
        Engine([Registered(_patch(dist), None)], matrix=source(bad)).apply_all(strict=True)


def test_apply_all_without_upstreams_reads_no_matrix() -> None:
    code = ("import sys, patchkit; patchkit.apply_all(); "
            "print(sorted(m for m in sys.modules if m.startswith(('patchkit.matrix', 'patchkit.runtime.drift', "
            "'patchkit.runtime.fingerprint', 'yaml'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_a_forced_variant_is_not_checked_for_drift(make_dist, tmp_path) -> None:
    original = make_dist("1.2.3")
    matrix = _recorded_matrix(original, tmp_path)
    outside = make_dist("2.0.0", like=original, source=SOURCE.replace("return x + 1", "return x + 7"))
    engine, status = _apply(outside, matrix, strict=True, force="toy.forward")
    engine.revert_all()
    assert status.state is State.FORCED and status.reason is Reason.UNSUPPORTED_VERSION


def test_the_doctor_compares_fingerprints_with_the_engines_records_and_reads_no_yaml(
    make_dist, tmp_path, monkeypatch
) -> None:
    from patchkit.doctor.runner import fingerprints

    def report(dist: Dist, source: Path | None) -> dict[str, str | None]:
        engine, status = _apply(dist, source)
        try:
            (facts,) = fingerprints(engine.patch("toy.forward"), status, engine.matrix).values()
        finally:
            engine.revert_all()
        assert facts["fingerprint"]
        return facts

    original = make_dist()
    matrix = _recorded_matrix(original, tmp_path)
    assert report(original, matrix)["match"] == "recorded"
    # The shipped index (a Python module, no YAML read) has no toy records.
    with monkeypatch.context() as patched:
        patched.setattr("patchkit.matrix.loader.load", lambda *a, **k: pytest.fail("read the YAML matrix"))
        assert report(original, None)["match"] == "unknown"
    changed = make_dist(like=original, source=SOURCE.replace("return x + 1", "return x + 100"))
    assert report(changed, matrix)["match"] == "drifted"


def test_an_engine_given_a_matrix_path_says_to_pass_its_records(tmp_path) -> None:
    # The runtime reads records, never a matrix file: the tooling turns one into records.
    with pytest.raises(TypeError, match=r"patchkit\.matrix\.index\.source"):
        Engine(matrix=tmp_path / "compat_matrix.yaml")
