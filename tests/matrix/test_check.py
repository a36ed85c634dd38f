"""`patchkit matrix check`: the registry and the matrix agree, and each kind of disagreement is found."""

from __future__ import annotations

from patchkit import Add, Patch, Replace, Variant
from patchkit.matrix.check import check, overlap
from patchkit.matrix.schema import parse
from patchkit.runtime.catalogue import Registered

HEAD = """schema: 1
environments:
  e:
    install: []
    tests: [t]
patches:
"""


def _registry(*variants: Variant, patch_id: str = "up.feature") -> list[Registered]:
    return [Registered(Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r", variants=variants), None)]


OLD = Variant({"up": ">=1.0,<2.0"}, (Replace("up.core:Model.forward", "x:y"),), label="old")
NEW = Variant({"up": ">=2.0"}, native="upstream has it from 2.0", label="new")


def _messages(text: str, registry: list[Registered]) -> list[str]:
    return [str(d) for d in check(parse(HEAD + text, "m.yaml"), registry)]


AGREEING = """  up.feature:
    old:
      - versions: {up: '1.5.0'}
        status: verified
        verified_by: ['tests:e']
        targets:
          'up.core:Model.forward': {fingerprint: 0123456789abcdef}
      - versions: {up: '2.0.0'}
        status: known-bad
    new:
      - versions: {up: '2.1.0'}
        status: native
"""


def test_agreeing_registry_and_matrix_have_no_disagreement() -> None:
    assert _messages(AGREEING, _registry(OLD, NEW)) == []


def test_a_variant_without_records_is_reported() -> None:
    text = AGREEING.replace("    new:\n      - versions: {up: '2.1.0'}\n        status: native\n", "")
    assert _messages(text, _registry(OLD, NEW)) == [
        "m.yaml:6:1: up.feature: variant 'new' has no version records; run its tests and "
        "`patchkit matrix record --env <environment>`"
    ]


def test_a_matrix_entry_for_an_unregistered_patch_or_variant_is_reported() -> None:
    messages = _messages(AGREEING + "  up.gone:\n    v:\n      - {versions: {up: '1.0'}, status: verified}\n",
                         _registry(OLD, NEW))
    assert messages == ["m.yaml:21:9: up.gone: in the matrix but no such patch is registered (known: up.feature)"]
    messages = _messages(AGREEING.replace("    new:", "    newer:"), _registry(OLD, NEW))
    assert "m.yaml:17:9: up.feature: the matrix has variant 'newer', the patch declares 'old', 'new'" in messages


def test_a_verified_version_outside_the_declared_range_is_reported() -> None:
    messages = _messages(AGREEING.replace("'1.5.0'", "'0.9.0'"), _registry(OLD, NEW))
    assert messages == ["m.yaml:9:9: up.feature: variant 'old' does not cover up 0.9.0, recorded as verified"]


def test_a_known_bad_version_inside_the_range_is_reported() -> None:
    messages = _messages(AGREEING.replace("'2.0.0'", "'1.9.0'"), _registry(OLD, NEW))
    assert messages == [
        "m.yaml:14:9: up.feature: variant 'old' covers up 1.9.0, recorded as known-bad; narrow the range"]


def test_overlapping_variants_of_one_patch_are_reported() -> None:
    wide = Variant({"up": ">=2.0"}, native="n", label="new")
    overlapping = Variant({"up": ">=1.0,<=2.0"}, (Replace("up.core:Model.forward", "x:y"),), label="old")
    messages = _messages(AGREEING, _registry(overlapping, wide))
    assert messages == ["up.feature: variants 'old' and 'new' overlap (both select up 2.0.0)",
                        "m.yaml:14:9: up.feature: variant 'old' covers up 2.0.0, recorded as known-bad; "
                        "narrow the range"]


def test_overlap_is_found_between_bounds_and_across_distributions() -> None:
    a = Variant({"up": ">1.6"}, native="n", label="a")
    b = Variant({"up": "<1.7"}, native="n", label="b")
    assert overlap(a, b) is not None and "1.6" < str(overlap(a, b)["up"]) < "1.7"
    c = Variant({"up": ">=1.0", "other": ">=3"}, native="n", label="c")
    d = Variant({"up": ">=1.0", "other": "<3"}, native="n", label="d")
    assert overlap(c, d) is None
    assert overlap(Variant({"up": "<2"}, native="n"), Variant({"up": ">=2"}, native="n")) is None


def test_recorded_targets_and_environments_must_exist() -> None:
    text = AGREEING.replace("'up.core:Model.forward'", "'up.core:Model.backward'").replace("'tests:e'", "'tests:gone'")
    assert _messages(text, _registry(OLD, NEW)) == [
        "m.yaml:9:9: up.feature: up.core:Model.backward is recorded but variant 'old' does not patch it",
        "m.yaml:9:9: up.feature: verified_by names environment 'gone', which the matrix does not define",
    ]


def test_add_targets_count_as_declared() -> None:
    adding = Variant({"up": ">=1.0,<2.0"}, (Add("up.core:Model.extra", "x:y"),), label="old")
    text = AGREEING.replace("'up.core:Model.forward'", "'up.core:Model.extra'")
    assert _messages(text, _registry(adding, NEW)) == []
