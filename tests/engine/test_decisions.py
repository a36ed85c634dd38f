"""The engine's decision, as a table: one row per case, plain values in, a state and its reason out.

:func:`patchkit.runtime.decision.decide` is pure: these rows need no upstream, no import hook and
no lock. The engine tests (test_version_gating, test_install_and_revert, ...) prove the same
decisions carried out on real distributions.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from patchkit import Patch, Reason, Replace, State, Variant
from patchkit.runtime.decision import Decision, Facts, Step, Trigger, decide, next_step
from patchkit.runtime.drift import Identity
from patchkit.runtime.errors import DeclarationError, ForceRefusedError, UnsupportedVersionError
from patchkit.runtime.pep440 import parse
from patchkit.runtime.settings import Settings
from patchkit.runtime.versions import Availability, InstalledVersion

CORE = "toyup.core"
OLD = Variant(requires={"toyup": ">=1.0,<2.0"}, installs=(Replace(f"{CORE}:Model.forward", "impl:old"),), label="v1")
NEW = Variant(requires={"toyup": ">=2.0,<3.0"}, installs=(Replace(f"{CORE}:Model.forward", "impl:new"),), label="v2")
NATIVE = Variant(requires={"toyup": ">=3.0"}, native="upstream does it since 3.0", label="native")


def _patch(*variants: Variant, opt_in: bool = False) -> Patch:
    return Patch(id="toy.forward", summary="s", why="w", upstream="u", removal="r", variants=variants,
                 opt_in=opt_in, version_modules={"toyup": "toyup"})


PATCH = _patch(OLD, NEW)
WITH_NATIVE = _patch(OLD, NEW, NATIVE)
OPT_IN = _patch(OLD, NEW, opt_in=True)
OVERLAPPING = _patch(OLD, Variant(requires={"toyup": ">=1.5"}, installs=NEW.installs, label="v1.5+"))


def _installed(raw: str | None) -> InstalledVersion:
    if raw is None:
        return InstalledVersion(Availability.MISSING)
    if raw == "deferred":
        return InstalledVersion(Availability.DEFERRED, module="toyup")
    if raw == "nightly-build":  # metadata that is no PEP 440 version
        return InstalledVersion(Availability.INSTALLED, None, raw)
    return InstalledVersion(Availability.INSTALLED, parse(raw), raw)


class Row(NamedTuple):
    case: str
    patch: Patch
    version: str | None  #: the installed toyup: a version, None (missing) or "deferred"
    expected: Decision
    settings: Settings = Settings()
    imported: frozenset[str] = frozenset({CORE})
    blocker: str | None = None  #: why code identity cannot hold (None: worth comparing)
    identity: Identity = Identity(False, f"{CORE}:Model.forward differs")


ROWS = [
    Row("in range: the variant installs", PATCH, "1.4", Decision(State.APPLIED, variant=OLD)),
    Row("in the second range", PATCH, "2.0.0", Decision(State.APPLIED, variant=NEW)),
    Row("a pre-release counts as its release", PATCH, "2.1.0rc1", Decision(State.APPLIED, variant=NEW)),
    Row("in range, target module not imported yet: waits for it, naming its variant", PATCH, "1.4",
        Decision(State.PENDING, detail=f"waiting for {CORE} to be imported", variant=OLD, waiting_for=(CORE,)),
        imported=frozenset()),
    Row("upstream not installed", PATCH, None, Decision(State.SKIPPED, Reason.NOT_INSTALLED, "toyup not installed")),
    Row("installed without metadata: the version is known on import", PATCH, "deferred",
        Decision(State.PENDING, detail="version of toyup known once toyup is imported", waiting_for=("toyup",))),
    Row("native range: nothing to install", WITH_NATIVE, "3.2",
        Decision(State.SKIPPED, Reason.NATIVE, "upstream does it since 3.0", variant=NATIVE)),
    Row("disabled by PATCHKIT_DISABLE", PATCH, "1.4",
        Decision(State.SKIPPED, Reason.DISABLED, "disabled by PATCHKIT_DISABLE"), Settings(disable=("toy.*",))),
    Row("not in PATCHKIT_ENABLE", PATCH, "1.4",
        Decision(State.SKIPPED, Reason.DISABLED, "not in PATCHKIT_ENABLE"), Settings(enable=("other.*",))),
    Row("disable wins over enable", PATCH, "1.4",
        Decision(State.SKIPPED, Reason.DISABLED, "disabled by PATCHKIT_DISABLE"),
        Settings(enable=("toy.forward",), disable=("toy.forward",))),
    Row("opt-in, not enabled", OPT_IN, "1.4",
        Decision(State.SKIPPED, Reason.OPT_IN, "opt-in: enable with PATCHKIT_OPT_IN=" + OPT_IN.id)),
    Row("opt-in, enabled", OPT_IN, "1.4", Decision(State.APPLIED, variant=OLD), Settings(enable=("toy.forward",))),
    Row("opt-in, turned on by PATCHKIT_OPT_IN", OPT_IN, "1.4", Decision(State.APPLIED, variant=OLD),
        Settings(opt_in=("toy.*",))),
    Row("opt-in, a glob in PATCHKIT_ENABLE does not turn it on", OPT_IN, "1.4",
        Decision(State.SKIPPED, Reason.OPT_IN, "opt-in: enable with PATCHKIT_OPT_IN=" + OPT_IN.id),
        Settings(enable=("toy.*",))),
    Row("a version that is no PEP 440 version is in no range, and not a newer release", PATCH, "nightly-build",
        Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION,
                 "installed toyup nightly-build is outside the verified ranges (v1; v2)"),
        identity=Identity(True, "same")),
    Row("below every range", PATCH, "0.9",
        Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION,
                 "installed toyup 0.9 is outside the verified ranges (v1; v2)")),
    Row("between ranges is a gap, not a new release: no code identity", _patch(OLD, NEW._replace(
        requires={"toyup": ">=2.5,<3.0"})), "2.2",
        Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION,
                 "installed toyup 2.2 is outside the verified ranges (v1; v2)"), identity=Identity(True, "same")),
    Row("unknown newer release, no records to compare", PATCH, "3.1",
        Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION,
                 "installed toyup 3.1 is outside the verified ranges (v1; v2); not code-identical: no records"),
        blocker="no records"),
    Row("unknown newer release, target not imported: waits to compare its code", PATCH, "3.1",
        Decision(State.PENDING, detail="installed toyup 3.1 is outside the verified ranges (v1; v2); its code is "
                                       f"compared with variant v2 once {CORE} is imported", waiting_for=(CORE,)),
        imported=frozenset()),
    Row("unknown newer release, code differs", PATCH, "3.1",
        Decision(State.SKIPPED, Reason.UNSUPPORTED_VERSION, "installed toyup 3.1 is outside the verified ranges "
                 f"(v1; v2); not code-identical: {CORE}:Model.forward differs")),
    Row("unknown newer release, code identical: the nearest variant installs", PATCH, "3.1",
        Decision(State.APPLIED, Reason.CODE_IDENTICAL, "code identical: installed toyup 3.1 is outside the "
                 "verified ranges (v1; v2), but every target of variant v2 is code it was verified on: as on 2.4",
                 variant=NEW), identity=Identity(True, "as on 2.4")),
    Row("forced past the range: the nearest variant installs", PATCH, "3.1",
        Decision(State.FORCED, Reason.UNSUPPORTED_VERSION,
                 "forced: installed toyup 3.1 is outside the verified ranges (v1; v2)", variant=NEW),
        Settings(force=("toy.forward",))),
    Row("forced below the range: the lowest variant", PATCH, "0.9",
        Decision(State.FORCED, Reason.UNSUPPORTED_VERSION,
                 "forced: installed toyup 0.9 is outside the verified ranges (v1; v2)", variant=OLD),
        Settings(force=("toy.forward",))),
    Row("forced, target not imported: waits, naming the forced variant", PATCH, "3.1",
        Decision(State.PENDING, detail=f"waiting for {CORE} to be imported", variant=NEW, waiting_for=(CORE,)),
        Settings(force=("toy.forward",)), imported=frozenset()),
    Row("forced in range: a plain install", PATCH, "1.4", Decision(State.APPLIED, variant=OLD),
        Settings(force=("toy.forward",))),
]


def _facts(row: Row, asked: list[str]) -> Facts:
    def blocker(variant: Variant) -> str | None:
        asked.append(f"blocker {variant.name}")
        return row.blocker

    def identity(variant: Variant) -> Identity:
        asked.append(f"identity {variant.name}")
        return row.identity

    return Facts(versions={"toyup": _installed(row.version)}, imported=row.imported.__contains__,
                 identity_blocker=blocker, identity=identity)


def _without_refusal(decision: Decision) -> Decision:
    return decision._replace(refusal=None)


@pytest.mark.parametrize("row", ROWS, ids=[row.case for row in ROWS])
def test_each_case_decides_its_state_reason_and_variant(row: Row) -> None:
    decision = decide(row.patch, row.settings, _facts(row, []))
    assert _without_refusal(decision) == row.expected


@pytest.mark.parametrize("case, checks", [
    ("in range: the variant installs", True),
    ("forced past the range: the nearest variant installs", False),
    ("unknown newer release, code identical: the nearest variant installs", False),
])
def test_drift_is_checked_only_for_an_install_in_its_verified_range(case: str, checks: bool) -> None:
    row = next(r for r in ROWS if r.case == case)
    assert decide(row.patch, row.settings, _facts(row, [])).checks_drift is checks


@pytest.mark.parametrize("row", [r for r in ROWS if r.expected.reason is Reason.UNSUPPORTED_VERSION
                                 and r.expected.state is State.SKIPPED], ids=lambda r: r.case)
def test_an_unsupported_version_carries_the_error_strict_mode_raises(row: Row) -> None:
    decision = decide(row.patch, row.settings, _facts(row, []))
    assert isinstance(decision.refusal, UnsupportedVersionError)
    assert decision.refusal.patch_id == "toy.forward" and decision.refusal.versions == {"toyup": row.version}
    assert decision.error is None  # the status records the skip, not an error


@pytest.mark.parametrize("version, chosen", [("3.2", NATIVE), ("2.4", NEW)])
def test_forcing_where_upstream_is_native_is_refused_not_installed(version: str, chosen: Variant) -> None:
    # 3.2: the native variant itself; 2.4 below it: NEW selected, but forcing asks nothing there.
    row = Row("", WITH_NATIVE, version, Decision(State.SKIPPED), Settings(force=("toy.forward",)))
    decision = decide(WITH_NATIVE, row.settings, _facts(row, []))
    if chosen is NEW:
        assert decision == Decision(State.APPLIED, variant=NEW)
        return
    assert (decision.state, decision.reason, decision.variant) == (State.SKIPPED, Reason.NATIVE, NATIVE)
    assert isinstance(decision.refusal, ForceRefusedError) and decision.error == str(decision.refusal)


def test_forcing_past_a_native_range_is_refused() -> None:
    patch = _patch(OLD, NATIVE._replace(requires={"toyup": ">=3.0,<4.0"}))
    row = Row("", patch, "5.0", Decision(State.SKIPPED), Settings(force=("toy.forward",)))
    decision = decide(patch, row.settings, _facts(row, []))
    assert decision.state is State.SKIPPED and decision.reason is Reason.NATIVE
    assert isinstance(decision.refusal, ForceRefusedError)


@pytest.mark.parametrize("row", [r for r in ROWS if r.version != "3.1"], ids=lambda r: r.case)
def test_records_are_read_only_for_a_release_beyond_every_range(row: Row) -> None:
    asked: list[str] = []
    decide(row.patch, row.settings, _facts(row, asked))
    assert asked == []


def test_code_is_compared_only_once_the_blocker_allows_and_the_targets_are_imported() -> None:
    by_case = {row.case: row for row in ROWS}
    for case, expected in [
        ("unknown newer release, no records to compare", ["blocker v2"]),
        ("unknown newer release, target not imported: waits to compare its code", ["blocker v2"]),
        ("unknown newer release, code differs", ["blocker v2", "identity v2"]),
    ]:
        asked: list[str] = []
        decide(PATCH, Settings(), _facts(by_case[case], asked))
        assert asked == expected, case


def test_a_switched_off_patch_reads_no_version() -> None:
    class Untouchable(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise AssertionError("a disabled patch read a version")

        get = __getitem__

    facts = Facts(versions=Untouchable(), imported=lambda m: True, identity_blocker=lambda v: None,
                  identity=lambda v: Identity(True, ""))
    assert decide(PATCH, Settings(disable=("*",)), facts).reason is Reason.DISABLED


def test_overlapping_variants_are_a_declaration_error() -> None:
    row = Row("", OVERLAPPING, "1.7", Decision(State.SKIPPED))
    with pytest.raises(DeclarationError, match="overlap"):
        decide(OVERLAPPING, Settings(), _facts(row, []))


STEPS = [
    # state, trigger, claimed, displaced -> step
    (State.REGISTERED, Trigger.APPLY_ALL, False, False, Step.DECIDE),
    (State.SKIPPED, Trigger.APPLY_ALL, False, False, Step.DECIDE),
    (State.PENDING, Trigger.APPLY_ALL, False, False, Step.DECIDE),
    (State.REVERTED, Trigger.APPLY_ALL, False, False, Step.DECIDE),
    (State.APPLIED, Trigger.APPLY_ALL, False, False, Step.LEAVE),  # already applied: idempotent
    (State.FORCED, Trigger.APPLY_ALL, False, False, Step.LEAVE),
    (State.APPLIED, Trigger.APPLY_ALL, False, True, Step.REINSTALL),  # displaced by a reload
    (State.FORCED, Trigger.APPLY_ALL, False, True, Step.REINSTALL),
    (State.APPLIED, Trigger.APPLY_ALL, True, True, Step.LEAVE),  # another pass holds it
    (State.FAILED, Trigger.APPLY_ALL, False, False, Step.LEAVE),  # stays failed until asked for by name
    (State.PENDING, Trigger.APPLY_ALL, True, False, Step.LEAVE),
    (State.FAILED, Trigger.APPLY, False, False, Step.DECIDE),
    (State.APPLIED, Trigger.APPLY, False, False, Step.LEAVE),
    (State.APPLIED, Trigger.APPLY, False, True, Step.LEAVE),  # apply() leaves a displaced patch to apply_all
    (State.SKIPPED, Trigger.APPLY, True, False, Step.LEAVE),
    (State.PENDING, Trigger.IMPORT, False, False, Step.DECIDE),
    (State.PENDING, Trigger.IMPORT, True, False, Step.LEAVE),
    (State.SKIPPED, Trigger.IMPORT, False, False, Step.LEAVE),
    (State.REVERTED, Trigger.IMPORT, False, False, Step.LEAVE),  # reverted while it waited
    (State.APPLIED, Trigger.IMPORT, False, False, Step.LEAVE),
]


@pytest.mark.parametrize("state, trigger, claimed, displaced, expected", STEPS,
                         ids=[f"{s.value}-{t.value}-{'claimed' if c else 'free'}{'-displaced' if d else ''}"
                              for s, t, c, d, _ in STEPS])
def test_when_a_patch_is_decided_again(state: State, trigger: Trigger, claimed: bool, displaced: bool,
                                       expected: Step) -> None:
    assert next_step(state, trigger, claimed=claimed, displaced=displaced) is expected
