"""`patchkit matrix static`: facts read from release artifacts, here unpacked into a local cache.

The artifacts are written in the cache layout ``fetch`` leaves behind (``<dist>/<version>/src`` and
a ``.complete`` marker), so no network is used; the downloading itself is exercised by the proof
against the drift report (test_static_proof.py), which runs where the artifacts are cached.
"""

from __future__ import annotations

from pathlib import Path

from patchkit import Add, Patch, Replace, Variant, Wrap
from patchkit.matrix.schema import parse
from patchkit.matrix.static import ANNOTATIONS_ONLY, CODE_CHANGED, FORMAT_ONLY, NEW, SIG_CHANGED, survey, verify_matrix
from patchkit.runtime.catalogue import Registered

_BASE = "class Base:\n    def run(self, x):\n        return x\n\n"
RELEASES = {
    "1.0.0": _BASE + "class Model(Base):\n    pass\n",
    "1.1.0": _BASE + "class Model(Base):\n    def run(self, x):\n        return x + 0\n\n"
                     "def helper(a):\n    return a\n",
    "1.2.0": _BASE + "class Model(Base):\n    def run(self, x: int):\n        return x + 0\n\n"
                     "def helper(a, b=None):\n    return a\n",
    "1.3.0": _BASE + "class Model(Base):\n    def run(self, x: int):\n        \"\"\"Now documented.\"\"\"\n"
                     "        return (x +\n                0)\n\ndef helper(a, b=None):\n    return a + 0\n",
}


def _cache(root: Path, dist: str = "up", releases: dict[str, str] = RELEASES) -> Path:
    for version, source in releases.items():
        src = root / dist / version / "src" / "up"
        src.mkdir(parents=True)
        (src / "__init__.py").write_text("")
        (src / "core.py").write_text(source)
        (root / dist / version / ".complete").write_text("up-local.tar.gz\n")
    return root


def test_survey_reports_presence_inheritance_and_each_kind_of_change(tmp_path: Path) -> None:
    found = survey("up", list(RELEASES), ["up.core:Model.run", "up.core:helper"], _cache(tmp_path))
    run = [(o.version, o.facts.status, o.facts.defined_at, o.change) for o in found if o.symbol.endswith("run")]
    assert run == [("1.0.0", "inherited", "Base.run", ""), ("1.1.0", "present", "Model.run", CODE_CHANGED),
                   ("1.2.0", "present", "Model.run", ANNOTATIONS_ONLY), ("1.3.0", "present", "Model.run", FORMAT_ONLY)]
    helper = [(o.version, o.facts.status, o.change, o.facts.signature) for o in found if o.symbol.endswith("helper")]
    assert helper == [("1.0.0", "absent", "", None), ("1.1.0", "present", NEW, "(a)"),
                      ("1.2.0", "present", SIG_CHANGED, "(a, b=None)"),
                      ("1.3.0", "present", CODE_CHANGED, "(a, b=None)")]


MATRIX = """schema: 1
environments:
  e: {install: [], tests: [t]}
patches:
  up.feature:
    v:
      - versions: {up: '1.2.0'}
        status: verified
        targets:
          'up.core:helper': {signature: '(a, b=None)'}
      - versions: {up: '1.3.0'}
        status: verified
        targets:
          'up.core:helper': {fingerprint: '0000000000000000'}
"""


def _registry() -> list[Registered]:
    variant = Variant({"up": ">=1.2"}, (Replace("up.core:helper", "x:y"), Add("up.core:Model.extra", "x:y")), label="v")
    return [Registered(Patch(id="up.feature", summary="s", why="w", upstream="u", removal="r", variants=(variant,)),
                       None)]


def test_verify_matrix_confirms_matching_records_and_flags_a_changed_fingerprint(tmp_path: Path) -> None:
    findings, _ = verify_matrix(parse(MATRIX), _registry(), _cache(tmp_path))
    by_version = {(f.versions, f.target): f for f in findings}
    assert by_version[("up 1.2.0", "up.core:helper")].ok
    assert by_version[("up 1.2.0", "up.core:Model.extra")].ok  # Add: absent upstream, as it must be
    bad = by_version[("up 1.3.0", "up.core:helper")]
    assert not bad.ok and "differs from the recorded 0000000000000000" in bad.message


def test_verify_matrix_record_fills_in_fingerprints_and_marks_static(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    matrix = parse(MATRIX.replace("{fingerprint: '0000000000000000'}", "{}"))
    findings, updated = verify_matrix(matrix, _registry(), cache, record=True)
    assert all(f.ok for f in findings)
    first, second = updated.records("up.feature", "v")
    assert first.verified_by == ("static",) and first.targets["up.core:helper"].signature == "(a, b=None)"
    assert first.targets["up.core:helper"].fingerprint != second.targets["up.core:helper"].fingerprint


def test_an_absent_target_or_an_existing_add_target_fails(tmp_path: Path) -> None:
    releases = {"1.2.0": "class Model:\n    extra = 1\n", "1.3.0": "def helper(a, b=None):\n    return a\n"}
    findings, _ = verify_matrix(parse(MATRIX), _registry(), _cache(tmp_path, releases=releases))
    failed = {(f.versions, f.target): f.message for f in findings if not f.ok}
    assert failed[("up 1.2.0", "up.core:helper")].startswith("absent from up-local.tar.gz")
    assert ("up 1.2.0", "up.core:Model.extra") not in failed  # a class attribute, not a def: Add still fits


def test_added_releases_in_range_are_checked_and_recorded(tmp_path: Path) -> None:
    releases = {**RELEASES, "1.4.0": "class Model:\n    pass\n"}  # 1.4.0 lost helper
    matrix = parse(MATRIX[:MATRIX.index("      - versions: {up: '1.3.0'}")])
    add = [("up", "1.0.0"), ("up", "1.3.0"), ("up", "1.4.0"), ("other", "1.3.0")]
    findings, updated = verify_matrix(matrix, _registry(), _cache(tmp_path, releases=releases), record=True, add=add)
    checked = {f.versions for f in findings}
    assert "up 1.0.0" not in checked and "other 1.3.0" not in checked  # outside >=1.2 / not required
    assert any(f.versions == "up 1.4.0" and not f.ok for f in findings)
    first, added = updated.records("up.feature", "v")
    assert (first.versions, added.versions) == ({"up": "1.2.0"}, {"up": "1.3.0"})  # 1.4.0 failed: not recorded
    assert added.verified_by == ("static",) and added.targets["up.core:helper"].fingerprint is not None


def test_a_reexported_target_is_found_where_it_is_defined(tmp_path: Path) -> None:
    cache = _cache(tmp_path, releases={"1.2.0": "from .impl import helper as helper\nfrom . import impl\n"})
    (cache / "up" / "1.2.0" / "src" / "up" / "impl.py").write_text("def helper(a, b=None):\n    return a\n")
    matrix = parse(MATRIX[:MATRIX.index("      - versions: {up: '1.3.0'}")])
    findings, updated = verify_matrix(matrix, _registry(), cache, record=True)
    helper = next(f for f in findings if f.target == "up.core:helper")
    assert helper.ok and "present (up.impl:helper)" in helper.message
    (record,) = updated.records("up.feature", "v")
    assert record.targets["up.core:helper"].fingerprint == survey(
        "up", ["1.2.0"], ["up.impl:helper"], cache)[0].facts.fingerprint


def test_a_target_another_patch_adds_is_not_required_upstream(tmp_path: Path) -> None:
    creator = Variant({"up": ">=1.0"}, (Add("up.core:Backport", "x:y"),), label="c")
    user = Variant({"up": ">=1.0"}, (Wrap("up.core:Backport.run", "x:y"),), label="u")
    patches = [Registered(Patch(id=pid, summary="s", why="w", upstream="u", removal="r", variants=(v,)), None)
               for pid, v in (("up.backport", creator), ("up.user", user))]
    findings, _ = verify_matrix(parse(MATRIX), patches, _cache(tmp_path), add=[("up", "1.2.0")])
    used = next(f for f in findings if f.target == "up.core:Backport.run")
    assert used.ok and used.message == "not upstream's: created at run time by up.backport (Add up.core:Backport)"
