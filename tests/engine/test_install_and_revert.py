"""Installing, rolling back and reverting: identity of what is installed and restored."""

from __future__ import annotations

import pytest

from patchkit import Add, Call, ForeignWrapperError, Patch, Reason, Replace, State, Variant, Wrap
from patchkit.runtime.errors import UnknownPatchError


def patched_forward(self, x):
    return x + 1000


def patched_backward(self, x):
    return x - 1000


def patched_compute(x):
    return -x


def patched_scale(x):
    return x * 3


def make_patch(up, installs, patch_id="toy.multi", **kwargs) -> Patch:
    return Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r",
                 variants=(Variant(requires={up.name: ">=1"}, installs=tuple(installs)),), **kwargs)


def three_targets(up):
    return [
        Replace(up.target("Model.forward"), patched_forward),
        Replace(up.target("Model.backward"), patched_backward),
        Replace(up.target("compute"), patched_compute),
    ]


def snapshot(core):
    return (core.Model.__dict__["forward"], core.Model.__dict__["backward"], core.__dict__["compute"])


def test_apply_twice_installs_the_same_objects(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    engine.register(make_patch(up, three_targets(up)))
    engine.apply_all()
    first = snapshot(core)
    engine.apply_all()
    assert all(a is b for a, b in zip(first, snapshot(core), strict=True))
    assert first == (patched_forward, patched_backward, patched_compute)
    assert core.Model().forward(1) == 1001


@pytest.mark.parametrize("failing_index", [0, 1, 2])
def test_failure_at_any_target_rolls_every_target_back(engine, make_upstream, failing_index):
    up = make_upstream()
    core = up.import_core()
    originals = snapshot(core)

    def failing_factory(original):
        raise RuntimeError("injected failure")

    installs = three_targets(up)
    installs[failing_index] = Wrap(installs[failing_index].target, failing_factory)
    engine.register(make_patch(up, installs))
    (record,) = engine.apply_all()
    assert record.state is State.FAILED and "injected failure" in record.error
    assert installs[failing_index].target in record.error
    assert all(a is b for a, b in zip(originals, snapshot(core), strict=True))


def test_missing_target_skips_the_whole_patch(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    originals = snapshot(core)
    installs = three_targets(up) + [Replace(up.target("Model.renamed_upstream"), patched_forward)]
    engine.register(make_patch(up, installs))
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and record.reason is Reason.TARGET_MISSING
    assert f"{up.core}:Model.renamed_upstream" in record.detail
    assert all(a is b for a, b in zip(originals, snapshot(core), strict=True))


def test_revert_restores_originals_by_identity(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    originals = snapshot(core)
    engine.register(make_patch(up, three_targets(up)))
    engine.apply_all()
    record = engine.revert("toy.multi")
    assert record.state is State.REVERTED
    assert all(a is b for a, b in zip(originals, snapshot(core), strict=True))
    engine.apply_all()  # a reverted patch is applied again by the next apply
    assert snapshot(core)[0] is patched_forward


def test_third_party_wrapper_on_top_is_detected_not_stripped(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    engine.register(make_patch(up, three_targets(up)))
    engine.apply_all()

    def third_party(self, x):
        return patched_forward(self, x) * 2

    core.Model.forward = third_party
    with pytest.raises(ForeignWrapperError, match="Model.forward"):
        engine.revert("toy.multi")
    assert core.Model.__dict__["forward"] is third_party
    assert core.Model.__dict__["backward"] is patched_backward  # nothing half-reverted
    (record,) = engine.status()
    assert record.state is State.APPLIED and record.reason is Reason.FOREIGN_WRAPPER
    statuses = engine.revert_all()  # reports, does not raise outside strict mode
    assert statuses[0].state is State.APPLIED


def test_wrap_receives_the_original_and_staticmethod_stays_static(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    original_scale = core.Model.__dict__["scale"]
    seen = []

    def wrap_scale(original):
        seen.append(original)
        return lambda x: original(x) + 1

    engine.register(make_patch(up, [Wrap(up.target("Model.scale"), wrap_scale)]))
    engine.apply_all()
    assert seen == [original_scale.__func__]
    assert isinstance(core.Model.__dict__["scale"], staticmethod)
    assert core.Model.scale(5) == 11 and core.Model().scale(5) == 11
    engine.revert("toy.multi")
    assert core.Model.__dict__["scale"] is original_scale


def test_inherited_attribute_is_deleted_on_revert_not_copied_down(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    engine.register(make_patch(up, [Replace(up.target("Child.forward"), patched_forward)]))
    engine.apply_all()
    assert core.Child().forward(1) == 1001 and core.Model().forward(1) == 2
    engine.revert("toy.multi")
    assert "forward" not in core.Child.__dict__


def test_add_creates_and_revert_deletes(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    engine.register(make_patch(up, [Add(up.target("Model.replay"), patched_forward)]))
    engine.apply_all()
    assert core.Model().replay(1) == 1001
    engine.revert("toy.multi")
    assert not hasattr(core.Model, "replay")


def test_add_refuses_an_existing_attribute(engine, make_upstream):
    up = make_upstream()
    up.import_core()
    engine.register(make_patch(up, [Add(up.target("Model.forward"), patched_forward)]))
    (record,) = engine.apply_all()
    assert record.state is State.SKIPPED and "already exists" in record.detail


def test_call_action_registers_and_unregisters(engine, make_upstream):
    up = make_upstream()
    up.import_core()
    registry = []
    engine.register(make_patch(up, [Call(lambda: registry.append("backend"), registry.clear, after=up.core)]))
    engine.apply_all()
    assert registry == ["backend"]
    engine.revert("toy.multi")
    assert registry == []


def test_relative_reference_resolves_in_the_declaring_package(engine, make_upstream, tmp_path):
    up = make_upstream()
    core = up.import_core()
    package = tmp_path / "site_relref" / "relpatches"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_impl.py").write_text("def forward(self, x):\n    return 'relative'\n")
    import sys

    sys.path.insert(0, str(package.parent))
    try:
        engine.register(make_patch(up, [Replace(up.target("Model.forward"), "._impl:forward")]), package="relpatches")
        engine.apply_all()
        assert core.Model().forward(0) == "relative"
    finally:
        engine.revert_all()
        sys.path.remove(str(package.parent))
        sys.modules.pop("relpatches._impl", None), sys.modules.pop("relpatches", None)


def test_pending_until_imported_then_installed_by_the_hook(engine, make_upstream):
    up = make_upstream()
    engine.register(make_patch(up, three_targets(up)))
    (record,) = engine.apply_all()
    assert record.state is State.PENDING and up.core in record.detail
    core = up.import_core()
    assert engine.status()[0].state is State.APPLIED
    assert core.Model().forward(1) == 1001


def test_applied_context_reverts_on_exit(engine, make_upstream):
    up = make_upstream()
    engine.register(make_patch(up, three_targets(up), opt_in=True))
    with engine.applied("toy.*") as records:
        core = up.import_core()  # imported by applied() already; this is a no-op
        assert records[0].state is State.APPLIED
        assert core.Model().forward(1) == 1001
    assert core.Model().forward(1) == 2
    assert engine.status()[0].state is State.REVERTED


def test_opt_in_patch_stays_off_unless_enabled(engine, make_upstream):
    up = make_upstream()
    up.import_core()
    engine.register(make_patch(up, three_targets(up), opt_in=True))
    (record,) = engine.apply_all()
    assert (record.state, record.reason) == (State.SKIPPED, Reason.OPT_IN)
    (record,) = engine.apply_all(enable="toy.multi")
    assert record.state is State.APPLIED


def test_apply_unknown_id_raises_with_suggestions(engine, make_upstream):
    up = make_upstream()
    engine.register(make_patch(up, three_targets(up)))
    with pytest.raises(UnknownPatchError, match="toy.multi"):
        engine.apply("toy.mult")


def test_targets_in_a_module_and_one_it_imports_install_after_both_finish(engine, make_upstream):
    # core.py imports helper.py at its top: helper finishes (and fires its hook) while core still
    # runs. The patch must wait for core, not report core's attributes missing.
    up = make_upstream()
    (up.root / up.package / "helper.py").write_text("def helper(x):\n    return x\n")
    core_source = (up.root / up.package / "core.py").read_text()
    (up.root / up.package / "core.py").write_text(f"from {up.package} import helper\n" + core_source)
    engine.register(make_patch(up, [Replace(f"{up.package}.helper:helper", patched_compute),
                                    Replace(up.target("Model.forward"), patched_forward)]))
    (record,) = engine.apply_all()
    assert record.state is State.PENDING
    core = up.import_core()
    (record,) = engine.status()
    assert record.state is State.APPLIED, record.detail
    assert core.Model().forward(1) == 1001 and core.helper.helper(3) == -3


def test_status_says_displaced_after_a_reload_and_apply_all_installs_the_patch_again(engine, make_upstream):
    import importlib

    up = make_upstream()
    core = up.import_core()
    engine.register(make_patch(up, three_targets(up)))
    engine.apply_all()
    importlib.reload(core)  # re-runs the module: a new Model class and a new compute, unpatched
    assert core.Model().forward(1) == 2
    (record,) = engine.status()
    assert record.state is State.DISPLACED and "reloaded" in record.detail
    (record,) = engine.apply_all()
    assert record.state is State.APPLIED
    assert snapshot(core) == (patched_forward, patched_backward, patched_compute)
    (record,) = engine.revert_all()
    assert record.state is State.REVERTED and core.Model().forward(1) == 2 and core.compute(1) == 10


def test_why_not_installed_answers_none_once_one_of_the_patches_is_installed(engine, make_upstream, monkeypatch):
    import patchkit

    monkeypatch.setattr(patchkit, "engine", lambda: engine)
    up = make_upstream()
    up.import_core()
    engine.register(make_patch(up, three_targets(up), opt_in=True))
    engine.apply_all()
    assert patchkit.why_not_installed("toy.multi") == (
        "patch 'toy.multi' is skipped, opt_in (opt-in: enable with PATCHKIT_OPT_IN=toy.multi)")
    assert patchkit.why_not_installed("toy.unknown") == "patch 'toy.unknown' is not registered"
    engine.apply_all(enable="toy.multi")
    assert patchkit.why_not_installed("toy.multi") is None
    assert patchkit.why_not_installed("toy.unknown", "toy.multi") is None
    engine.revert("toy.multi")
    assert patchkit.why_not_installed("toy.multi") == "patch 'toy.multi' is reverted (originals restored)"
    with pytest.raises(ValueError, match="at least one patch id"):
        patchkit.why_not_installed()
