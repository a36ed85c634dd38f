"""Variant selection against real distributions created on the fly."""

from __future__ import annotations

import pytest

from patchkit import Patch, Reason, Replace, State, Variant


def new_forward(self, x):
    return x + 100


def old_forward(self, x):
    return x + 200


def toy_patch(patch_id: str, *variants: Variant, **fields) -> Patch:
    """A patch with placeholder texts: what these tests look at is its variants."""
    return Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r", variants=variants, **fields)


def forward_replaced_by(up, function):
    return (Replace(up.target("Model.forward"), function),)


def two_variant_patch(up, *, extra_requires=None) -> Patch:
    extra = extra_requires or {}
    return toy_patch(
        "toy.forward",
        Variant(requires={up.name: ">=1.0,<2.0", **extra}, installs=forward_replaced_by(up, old_forward)),
        Variant(requires={up.name: ">=2.0,<3.0", **extra}, installs=forward_replaced_by(up, new_forward)),
        version_modules={up.name: up.package},
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
    assert record.versions == {up.name: version}
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
    patch = two_variant_patch(up, extra_requires={other.name: ">=0.4"})
    engine.register(patch)
    up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and record.reason is Reason.UNSUPPORTED_VERSION
    assert record.versions == {up.name: "1.5", other.name: "0.3"}


def test_several_distributions_in_one_rule_all_holding(engine, make_upstream):
    up = make_upstream("2.2")
    other = make_upstream("0.5")
    engine.register(two_variant_patch(up, extra_requires={other.name: ">=0.4"}))
    core = up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.APPLIED and record.variant == f"{up.name}>=2.0,<3.0;{other.name}>=0.4"
    assert core.Model.__dict__["forward"] is new_forward


def test_distribution_missing_is_a_skip_not_an_error(engine):
    patch = toy_patch(
        "toy.absent",
        Variant(requires={"no-such-dist": ">=1"}, installs=(Replace("no_such_module_xyz:f", new_forward),)),
        version_modules={"no-such-dist": "no_such_module_xyz"},
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
    assert record.state is State.APPLIED and record.versions == {up.name: "2.4.0"}
    assert core.Model.__dict__["forward"] is new_forward


def test_native_variant_installs_nothing(engine, make_upstream):
    up = make_upstream("3.1")
    patch = toy_patch(
        "toy.native",
        Variant(requires={up.name: "<3"}, installs=forward_replaced_by(up, new_forward)),
        Variant(requires={up.name: ">=3"}, native="upstream does this since 3.0"),
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
    assert record.variant == f"{up.name}>=2.0,<3.0"
    assert core.Model.__dict__["forward"] is new_forward


def test_overlapping_variants_are_a_declaration_error(engine, make_upstream):
    up = make_upstream("1.5")
    patch = toy_patch(
        "toy.overlap",
        Variant(requires={up.name: ">=1"}, installs=forward_replaced_by(up, new_forward)),
        Variant(requires={up.name: ">=1.4"}, installs=forward_replaced_by(up, old_forward)),
    )
    engine.register(patch)
    up.import_core()
    (record,) = engine.apply_all()
    assert record.state is State.FAILED and "overlap" in record.error


# -- code identity: a release past every range whose patched code did not change -------------------

MATRIX = "schema: 1\nenvironments:\n  toy:\n    install: []\n    tests: [tests/engine]\n"


#: An edit of the toy upstream's ``Model.forward``: a release with it is not the code that was recorded.
FORWARD_CHANGED = ("return x + 1", "return x + 2")


def _recorded(make_upstream, tmp_path, name):
    """Toy upstream ``name`` 2.5 (in the patch's last range), and compat_matrix.yaml as `patchkit matrix
    record --env toy` writes it with that release installed."""
    from patchkit.matrix.record import record
    from patchkit.matrix.schema import parse
    from patchkit.matrix.writer import replace_patches
    from patchkit.runtime.catalogue import Registered

    verified = make_upstream("2.5", name=name)
    matrix = record(parse(MATRIX), [Registered(two_variant_patch(verified), None)], "toy")
    path = tmp_path / "compat_matrix.yaml"
    path.write_text(replace_patches(MATRIX, matrix.patches))
    return verified, path


def _engine(patch, matrix):
    from patchkit import Engine
    from patchkit.matrix.index import source
    from patchkit.runtime.catalogue import Registered

    return Engine([Registered(patch, None)], matrix=None if matrix is None else source(matrix))


@pytest.mark.parametrize("version", ["3.0", "3.7.1", "3.0.0rc1", "4.0.0.dev2"])
def test_a_release_past_every_range_with_identical_code_applies_as_code_identical(make_upstream, tmp_path, version):
    verified, matrix = _recorded(make_upstream, tmp_path, "toyup-ident")
    up = make_upstream(version, like=verified)
    engine = _engine(two_variant_patch(up), matrix)
    try:
        (pending,) = engine.apply_all()
        assert pending.state is State.PENDING and "compared with variant" in pending.detail  # nothing imported
        core = up.import_core()
        (record,) = engine.status()
        assert (record.state, record.reason) == (State.APPLIED, Reason.CODE_IDENTICAL)
        assert record.variant == "toyup-ident>=2.0,<3.0" and "toyup-ident 2.5" in record.detail
        assert record.to_dict()["reason"] == "code_identical"
        assert core.Model.__dict__["forward"] is new_forward
    finally:
        engine.revert_all()


def test_a_changed_target_keeps_a_release_past_every_range_skipped_and_names_it(make_upstream, tmp_path) -> None:
    verified, matrix = _recorded(make_upstream, tmp_path, "toyup-changed")
    up = make_upstream("3.1", like=verified, change=FORWARD_CHANGED)
    engine = _engine(two_variant_patch(up), matrix)
    engine.apply_all()
    core = up.import_core()
    (record,) = engine.status()
    assert (record.state, record.reason) == (State.SKIPPED, Reason.UNSUPPORTED_VERSION)
    assert f"{up.target('Model.forward')} differs" in record.detail
    assert "forward" not in {k for k, v in core.Model.__dict__.items() if v in (new_forward, old_forward)}


def test_strict_mode_raises_for_a_changed_release_and_force_still_forces(make_upstream, tmp_path) -> None:
    from patchkit import UnsupportedVersionError

    verified, matrix = _recorded(make_upstream, tmp_path, "toyup-strict")
    up = make_upstream("3.1", like=verified, change=FORWARD_CHANGED)
    engine = _engine(two_variant_patch(up), matrix)
    up.import_core()
    with pytest.raises(UnsupportedVersionError) as caught:
        engine.apply_all(strict=True)
    assert up.target("Model.forward") in str(caught.value)
    forced_engine = _engine(two_variant_patch(up), matrix)
    (forced,) = forced_engine.apply_all(force="toy.forward")
    assert forced.state is State.FORCED
    forced_engine.revert_all()


def test_code_identity_needs_records_and_never_fills_a_gap_between_ranges(make_upstream, tmp_path) -> None:
    verified, matrix = _recorded(make_upstream, tmp_path, "toyup-gap")
    # no records at all (the shipped index knows no toy patch): known before anything is imported
    up = make_upstream("3.1", name="toyup-norecord")
    (record,) = _engine(two_variant_patch(up), None).apply_all()
    assert record.state is State.SKIPPED and "no fingerprint recorded" in record.detail
    # 0.9 is below every range: a gap, not a new release
    low = make_upstream("0.9", like=verified)
    low.import_core()
    (record,) = _engine(two_variant_patch(low), matrix).apply_all()
    assert record.state is State.SKIPPED and "code" not in record.detail


# -- PATCHKIT_FORCE never installs what upstream has natively ---------------------------------------

def _native_from_3(up) -> Patch:
    return toy_patch(
        "toy.native",
        Variant(requires={up.name: "<2"}, installs=forward_replaced_by(up, new_forward)),
        Variant(requires={up.name: ">=3,<4"}, native="upstream renumbers experts itself since 3.0"),
    )


@pytest.mark.parametrize("version", ["3.2", "4.1"])
def test_force_is_refused_where_upstream_is_native(engine, make_upstream, version) -> None:
    from patchkit import ForceRefusedError

    up = make_upstream(version)
    engine.register(_native_from_3(up))
    core = up.import_core()
    original = core.Model.__dict__["forward"]
    (record,) = engine.apply_all(force="toy.native")
    assert (record.state, record.reason) == (State.SKIPPED, Reason.NATIVE)
    assert "PATCHKIT_FORCE refused" in record.error and "apply it twice" in record.error
    assert core.Model.__dict__["forward"] is original
    with pytest.raises(ForceRefusedError, match="upstream renumbers experts itself"):
        engine.apply_all(force="toy.native", strict=True)
    assert core.Model.__dict__["forward"] is original


def test_force_still_applies_where_no_native_range_starts(engine, make_upstream) -> None:
    up = make_upstream("2.5")  # between the ranges: <2 installs, native starts at 3
    engine.register(_native_from_3(up))
    core = up.import_core()
    (record,) = engine.apply_all(force="toy.native")
    assert record.state is State.FORCED
    assert core.Model.__dict__["forward"] is new_forward


def test_a_dotted_version_module_is_looked_up_without_importing_its_parents(tmp_path, monkeypatch):
    """Without metadata, a missing distribution's ``megatron.bridge`` must not import ``megatron``'s
    ``__init__`` to find out (for ``vllm.x`` that would be all of vLLM at start-up)."""
    import sys

    from patchkit.runtime.installed import _module_findable

    heavy = tmp_path / "pk_heavy_parent"
    (heavy / "sub").mkdir(parents=True)
    (heavy / "__init__.py").write_text("raise RuntimeError('the parent package was imported')\n")
    (heavy / "sub" / "__init__.py").write_text("")
    (heavy / "leaf.py").write_text("")
    (tmp_path / "pk_namespace_parent" / "inner").mkdir(parents=True)
    (tmp_path / "pk_namespace_parent" / "inner" / "mod.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))

    assert _module_findable("pk_heavy_parent.sub")
    assert _module_findable("pk_heavy_parent.leaf")
    assert not _module_findable("pk_heavy_parent.missing")
    assert not _module_findable("pk_heavy_parent.leaf.deeper")
    assert _module_findable("pk_namespace_parent.inner.mod")
    assert not _module_findable("pk_namespace_parent.inner.missing")
    assert not _module_findable("pk_no_such_top.sub")
    assert not {"pk_heavy_parent", "pk_namespace_parent"} & set(sys.modules)


def test_one_pass_reads_each_distributions_version_once_and_the_next_pass_reads_it_again(
        engine, make_upstream, monkeypatch):
    # Start-up: most patches of a family ask for the same distribution, each answer a sys.path search.
    from patchkit.runtime import installed

    up = make_upstream("2.0")
    engine.register_all([two_variant_patch(up)._replace(id=f"toy.forward{n}") for n in range(5)])
    asked: list[str] = []
    real = installed.find
    monkeypatch.setattr(installed, "find", lambda dist, module: asked.append(dist) or real(dist, module))
    engine.apply_all()
    assert asked == [up.name]
    engine.revert_all()
    engine.apply_all()
    assert asked == [up.name, up.name]
