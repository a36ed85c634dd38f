"""Variant selection against real distributions created on the fly."""

from __future__ import annotations

import pytest

from patchkit import Patch, Reason, Replace, State, Variant


def new_forward(self, x):
    return x + 100


def old_forward(self, x):
    return x + 200


def two_variant_patch(up, *, extra_requires=None) -> Patch:
    return Patch(
        id="toy.forward",
        summary="s", why="w", upstream="u", removal="r",
        version_modules={up.dist: up.package},
        variants=(
            Variant(requires={up.dist: ">=1.0,<2.0", **(extra_requires or {})},
                    installs=(Replace(up.target("Model.forward"), old_forward),)),
            Variant(requires={up.dist: ">=2.0,<3.0", **(extra_requires or {})},
                    installs=(Replace(up.target("Model.forward"), new_forward),)),
        ),
    )


@pytest.mark.parametrize(
    "version, expected",
    [
        ("1.0", old_forward), ("1.9.9", old_forward), ("2.0.0", new_forward), ("2.5", new_forward),
        # pre-release, dev and local builds count as the release they lead to
        ("2.1.0rc1", new_forward), ("2.1.0.dev3", new_forward), ("1.5.0rc1+git1a2b", old_forward),
        ("2.0.0+local.7", new_forward),
    ],
)
def test_variant_selected_by_installed_version(engine, make_upstream, version, expected):
    up = make_upstream(version)
    engine.register(two_variant_patch(up))
    core = up.import_core()
    (record,) = [r for r in engine.apply_all() if r.id == "toy.forward"]
    assert record.state is State.APPLIED
    assert record.versions == {up.dist: version}
    assert core.Model.__dict__["forward"] is expected


@pytest.mark.parametrize("version", ["0.9", "3.0", "3.0.0rc1", "2.0.0rc1"])
def test_version_outside_every_range_is_skipped_and_untouched(engine, make_upstream, version):
    # 2.0.0rc1 is a pre-release of 2.0: not in ">=2.0" and not in "<2.0" by PEP 440 (exclusive bound)
    up = make_upstream(version)
    engine.register(two_variant_patch(up))
    core = up.import_core()
    original = core.Model.__dict__["forward"]
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and record.reason is Reason.UNSUPPORTED_VERSION
    assert version in record.detail and ">=1.0,<2.0" in record.detail
    assert core.Model.__dict__["forward"] is original


def test_every_distribution_of_a_rule_must_hold(engine, make_upstream):
    up = make_upstream("1.5")
    other = make_upstream("0.3")
    patch = two_variant_patch(up, extra_requires={other.dist: ">=0.4"})
    engine.register(patch)
    up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and record.reason is Reason.UNSUPPORTED_VERSION
    assert record.versions == {up.dist: "1.5", other.dist: "0.3"}


def test_several_distributions_in_one_rule_all_holding(engine, make_upstream):
    up = make_upstream("2.2")
    other = make_upstream("0.5")
    engine.register(two_variant_patch(up, extra_requires={other.dist: ">=0.4"}))
    core = up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.APPLIED and record.variant == f"{up.dist}>=2.0,<3.0;{other.dist}>=0.4"
    assert core.Model.__dict__["forward"] is new_forward


def test_distribution_missing_is_a_skip_not_an_error(engine):
    patch = Patch(
        id="toy.absent", summary="s", why="w", upstream="u", removal="r",
        version_modules={"no-such-dist": "no_such_module_xyz"},
        variants=(Variant(requires={"no-such-dist": ">=1"}, installs=(Replace("no_such_module_xyz:f", new_forward),)),),
    )
    engine.register(patch)
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and record.reason is Reason.NOT_INSTALLED
    assert "no-such-dist" in record.detail


def test_metadata_missing_uses_dunder_version_once_imported(engine, make_upstream):
    up = make_upstream("2.4.0", metadata=False)
    engine.register(two_variant_patch(up))
    (record,) = engine.apply_all()
    # patchkit never imports the upstream to learn its version: it waits for the user's import
    assert record.state is State.PENDING and up.package in record.detail
    core = up.import_core()
    (record,) = engine.status()
    assert record.state is State.APPLIED and record.versions == {up.dist: "2.4.0"}
    assert core.Model.__dict__["forward"] is new_forward


def test_native_variant_installs_nothing(engine, make_upstream):
    up = make_upstream("3.1")
    patch = Patch(
        id="toy.native", summary="s", why="w", upstream="u", removal="r",
        variants=(
            Variant(requires={up.dist: "<3"}, installs=(Replace(up.target("Model.forward"), new_forward),)),
            Variant(requires={up.dist: ">=3"}, native="upstream does this since 3.0"),
        ),
    )
    engine.register(patch)
    core = up.import_core()
    original = core.Model.__dict__["forward"]
    (record,) = engine.apply_all()
    assert (record.state, record.reason) == (State.SKIPPED, Reason.NATIVE)
    assert record.detail == "upstream does this since 3.0"
    assert core.Model.__dict__["forward"] is original


def test_force_applies_nearest_variant_and_says_so(engine, make_upstream):
    up = make_upstream("3.4")
    engine.register(two_variant_patch(up))
    core = up.import_core()
    (record,) = engine.apply_all(force="toy.forward")
    assert record.state is State.FORCED and record.reason is Reason.UNSUPPORTED_VERSION
    assert record.variant == f"{up.dist}>=2.0,<3.0"
    assert core.Model.__dict__["forward"] is new_forward


def test_overlapping_variants_are_a_declaration_error(engine, make_upstream):
    up = make_upstream("1.5")
    patch = Patch(
        id="toy.overlap", summary="s", why="w", upstream="u", removal="r",
        variants=(
            Variant(requires={up.dist: ">=1"}, installs=(Replace(up.target("Model.forward"), new_forward),)),
            Variant(requires={up.dist: ">=1.4"}, installs=(Replace(up.target("Model.forward"), old_forward),)),
        ),
    )
    engine.register(patch)
    up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.FAILED and "overlap" in record.error
