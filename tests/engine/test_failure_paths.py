"""Failure paths: undo steps that raise, reverts that are refused, and strict-mode hook failures.

Every failure leaves a state that says what happened, keeps every error, and from which
``revert()`` restores the originals.
"""

from __future__ import annotations

import pytest

from patchkit import (
    Call,
    ForeignWrapperError,
    Patch,
    PatchInstallError,
    Reason,
    Replace,
    RevertError,
    State,
    UndoError,
    Variant,
    Wrap,
)


class Registry:
    """A toy upstream registry for ``Call`` actions whose undo can be made to fail."""

    def __init__(self, undo_failures: int = 0) -> None:
        self.registered = False
        self.undo_failures = undo_failures

    def install(self) -> None:
        self.registered = True

    def uninstall(self) -> None:
        if self.undo_failures:
            self.undo_failures -= 1
            raise RuntimeError("undo exploded")
        self.registered = False


def wrapping(original):
    def wrapped(self, x):
        return ("wrapped", original(self, x))

    return wrapped


def exploding_factory(original):
    raise ValueError("factory exploded")


def patched(self, x):
    return "patched"


def patch(patch_id, up, *actions):
    return Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r",
                 variants=(Variant(requires={up.name: ">=1"}, installs=tuple(actions)),))


def test_rollback_goes_on_past_a_failing_undo_keeps_both_errors_and_revert_finishes_it(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    original = core.Model.__dict__["forward"]
    registry = Registry(undo_failures=1)
    engine.register(patch("toy.rollback", up,
                          Wrap(up.target("Model.forward"), wrapping),
                          Call(registry.install, registry.uninstall, after=up.core),
                          Wrap(up.target("Model.backward"), exploding_factory)))
    (record,) = engine.apply_all()
    assert record.state is State.FAILED
    assert "factory exploded" in record.error and "undo exploded" in record.error
    assert core.Model.__dict__["forward"] is original  # target 1 rolled back despite the failing undo
    assert registry.registered  # the step whose undo raised is still in place, and known to be
    record = engine.revert("toy.rollback")
    assert record.state is State.REVERTED
    assert not registry.registered


def test_install_error_names_the_rollback_failures(engine, make_upstream):
    up = make_upstream()
    up.import_core()
    registry = Registry(undo_failures=1)
    engine.register(patch("toy.rollback", up, Call(registry.install, registry.uninstall, after=up.core),
                          Wrap(up.target("Model.backward"), exploding_factory)))
    with pytest.raises(PatchInstallError) as raised:
        engine.apply_all(strict=True)
    assert [where for where, _ in raised.value.rollback_errors] == [f"{up.core}: Registry.install"]
    assert isinstance(raised.value.__cause__, ValueError)
    assert engine.status()[0].state is State.FAILED


def test_revert_all_reverts_every_other_patch_and_raises_one_error_naming_each_failure(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    originals = dict(core.Model.__dict__)
    stuck, flaky = Registry(undo_failures=1), Registry(undo_failures=1)
    engine.register(patch("toy.a_plain", up, Replace(up.target("Model.forward"), patched)))
    engine.register(patch("toy.m_stuck", up, Call(stuck.install, stuck.uninstall, after=up.core)))
    engine.register(patch("toy.z_flaky", up, Wrap(up.target("Model.backward"), wrapping),
                          Call(flaky.install, flaky.uninstall, after=up.core)))
    assert {r.state for r in engine.apply_all()} == {State.APPLIED}
    with pytest.raises(RevertError) as raised:
        engine.revert_all()
    assert set(raised.value.errors) == {"toy.m_stuck", "toy.z_flaky"}
    assert all(isinstance(e, UndoError) for e in raised.value.errors.values())
    assert "toy.m_stuck" in str(raised.value) and "toy.z_flaky" in str(raised.value)
    states = {r.id: r.state for r in engine.status()}
    assert states == {"toy.a_plain": State.REVERTED, "toy.m_stuck": State.FAILED, "toy.z_flaky": State.FAILED}
    assert core.Model.__dict__["forward"] is originals["forward"]
    assert core.Model.__dict__["backward"] is originals["backward"]  # restored though its Call's undo raised
    # Reverting again retries exactly what failed, and blames no foreign wrapper that is not there.
    record = engine.revert("toy.z_flaky")
    assert record.state is State.REVERTED and not flaky.registered


def test_applied_context_reverts_the_others_when_one_revert_is_refused(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    original_backward = core.Model.__dict__["backward"]
    engine.register(patch("toy.a", up, Replace(up.target("Model.forward"), patched)))
    engine.register(patch("toy.b", up, Replace(up.target("Model.backward"), patched)))
    with pytest.raises(RevertError) as raised:
        with engine.applied("toy.*"):
            core.Model.forward = wrapping(core.Model.forward)  # a third party wraps on top of toy.a
    assert isinstance(raised.value.errors["toy.a"], ForeignWrapperError)
    assert core.Model.__dict__["backward"] is original_backward  # toy.b reverted all the same
    states = {r.id: (r.state, r.reason) for r in engine.status()}
    assert states == {"toy.a": (State.APPLIED, Reason.FOREIGN_WRAPPER), "toy.b": (State.REVERTED, None)}


def test_strict_failure_in_the_import_hook_is_recorded_failed_and_a_retried_import_does_not_hide_it(
        engine, make_upstream):
    up = make_upstream()
    engine.register(patch("toy.broken", up, Wrap(up.target("Model.forward"), exploding_factory)))
    assert engine.apply_all(strict=True)[0].state is State.PENDING
    with pytest.raises(PatchInstallError, match="factory exploded"):
        up.import_core()
    (record,) = engine.status()
    assert record.state is State.FAILED and "factory exploded" in record.error
    core = up.import_core()  # a retry loads the module, unpatched: the status must not say pending
    assert core.Model().forward(1) == 2
    (record,) = engine.status()
    assert record.state is State.FAILED and "factory exploded" in record.error


def test_a_failure_armed_by_strict_apply_all_is_kept_after_a_non_strict_apply(engine, make_upstream):
    up = make_upstream()
    engine.register(patch("toy.broken", up, Wrap(up.target("Model.forward"), exploding_factory)))
    engine.register(Patch(id="toy.other", summary="s", why="w", upstream="u", removal="r", opt_in=True,
                          variants=(Variant(requires={up.name: ">=1"},
                                            installs=(Replace(up.target("compute"), patched),)),)))
    engine.apply_all(strict=True)
    engine.apply("toy.other", strict=False)  # the engine is no longer strict: the hook failure is logged
    up.import_core()
    record = {r.id: r for r in engine.status()}["toy.broken"]
    assert record.state is State.FAILED and "factory exploded" in record.error


def test_non_strict_hook_failure_is_recorded_with_its_error(engine, make_upstream):
    up = make_upstream()
    engine.register(patch("toy.broken", up, Wrap(up.target("Model.forward"), exploding_factory)))
    engine.apply_all()
    core = up.import_core()
    (record,) = engine.status()
    assert record.state is State.FAILED and "factory exploded" in record.error
    assert core.Model().forward(1) == 2
