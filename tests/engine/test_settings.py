"""Malformed PATCHKIT_* values and unknown ids: a clear error, nothing applied, no crash unless strict."""

from __future__ import annotations

import pytest

from patchkit import ConfigError, Patch, Reason, Replace, State, UnknownPatchError, Variant
from patchkit.runtime import settings


def forward(self, x):
    return "patched"


@pytest.fixture
def toy(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    for patch_id in ("toy.forward", "toy.backward"):
        attr = patch_id.split(".")[1]
        engine.register(Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r",
                              variants=(Variant(requires={up.dist: ">=1"},
                                                installs=(Replace(up.target(f"Model.{attr}"), forward),)),)))
    return engine, core


MALFORMED = [
    ("PATCHKIT_DISABLE", "toy.forward,,toy.backward", "empty entry"),
    ("PATCHKIT_DISABLE", ",", "empty entry"),
    ("PATCHKIT_DISABLE", "toy/forward", "bad entry"),
    ("PATCHKIT_DISABLE", "toy.forward;rm -rf", "bad entry"),
    ("PATCHKIT_DISABLE", "Toy.Forward", "bad entry"),
    ("PATCHKIT_DISABLE", ".toy", "bad entry"),
    ("PATCHKIT_DISABLE", "toy..forward", "bad entry"),
    ("PATCHKIT_DISABLE", "toy.[forward", "bad entry"),
    ("PATCHKIT_ENABLE", "toy.forward toy.backward", "bad entry"),
    ("PATCHKIT_ENABLE", "toy.forward,", "empty entry"),
    ("PATCHKIT_FORCE", "toy.forward=1", "bad entry"),
    ("PATCHKIT_FORCE", "$(whoami)", "bad entry"),
    ("PATCHKIT_STRICT", "maybe", "accepted: 1, true"),
    ("PATCHKIT_STRICT", "2", "accepted: 1, true"),
    ("PATCHKIT_DISABLE", "tóy.forward", "bad entry"),
]

UNKNOWN = [
    ("PATCHKIT_DISABLE", "toy.forwrd", "toy.forward"),
    ("PATCHKIT_ENABLE", "toy.backwards", "toy.backward"),
    ("PATCHKIT_FORCE", "megatron.nothing", None),
]


@pytest.mark.parametrize("variable, value, problem", MALFORMED)
def test_malformed_value_applies_nothing_and_names_the_variable(toy, monkeypatch, caplog, variable, value, problem):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    original = core.Model.__dict__["forward"]
    records = engine.apply_all()  # no exception: the host process carries on
    assert {r.state for r in records} == {State.SKIPPED}
    assert {r.reason for r in records} == {Reason.CONFIG_ERROR}
    assert variable in records[0].detail and problem in records[0].detail and "accepted" in records[0].detail
    assert core.Model.__dict__["forward"] is original
    assert variable in caplog.text


@pytest.mark.parametrize("variable, value, problem", MALFORMED)
def test_malformed_value_raises_in_strict_mode(toy, monkeypatch, variable, value, problem):
    engine, core = toy
    if variable == "PATCHKIT_STRICT":
        # a malformed PATCHKIT_STRICT cannot ask for strictness; the parser still rejects it
        with pytest.raises(ConfigError, match=variable):
            settings.from_environment({variable: value})
        return
    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("PATCHKIT_STRICT", "1")
    with pytest.raises(ConfigError, match=variable) as info:
        engine.apply_all()
    assert info.value.variable == variable and info.value.value == value


@pytest.mark.parametrize("variable, value, suggestion", UNKNOWN)
def test_unknown_id_suggests_the_closest(toy, monkeypatch, variable, value, suggestion):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    records = engine.apply_all()
    assert {r.reason for r in records} == {Reason.CONFIG_ERROR}
    if suggestion:
        assert f"did you mean {suggestion}" in records[0].detail
    with pytest.raises(UnknownPatchError) as info:
        engine.apply_all(strict=True)
    assert info.value.patch_id == value


def test_malformed_log_level_is_rejected_with_the_accepted_forms():
    with pytest.raises(ConfigError, match="PATCHKIT_LOG_LEVEL.*DEBUG, INFO"):
        settings.from_environment({"PATCHKIT_LOG_LEVEL": "LOUD"})
    assert settings.from_environment({"PATCHKIT_LOG_LEVEL": "debug"}).log_level == 10


def test_glob_matching_nothing_only_warns(toy, monkeypatch, caplog):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "vllm.*")
    records = engine.apply_all()
    assert {r.state for r in records} == {State.APPLIED}
    assert "matches no known patch" in caplog.text


def test_disable_star_disables_everything(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "*")
    assert {(r.state, r.reason) for r in engine.apply_all()} == {(State.SKIPPED, Reason.DISABLED)}


def test_enable_restricts_and_disable_wins(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_ENABLE", "toy.*")
    monkeypatch.setenv("PATCHKIT_DISABLE", "toy.backward")
    states = {r.id: r.state for r in engine.apply_all()}
    assert states == {"toy.backward": State.SKIPPED, "toy.forward": State.APPLIED}


def test_explicit_argument_beats_environment(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "*")
    states = {r.id: r.state for r in engine.apply_all(disable=[])}
    assert set(states.values()) == {State.APPLIED}


def test_disable_env_wins_over_explicit_apply(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "toy.forward")
    (record,) = engine.apply("toy.forward")
    assert record.reason is Reason.DISABLED
