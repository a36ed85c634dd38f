"""Malformed PATCHKIT_* values and unknown ids: a clear error, nothing applied, no crash unless strict."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from patchkit import ConfigError, Patch, PatchkitWarning, Reason, Replace, State, UnknownPatchError, Variant
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
    ("PATCHKIT_DISABLE", "   ", "whitespace only"),
    ("PATCHKIT_ENABLE", "\t", "whitespace only"),
    ("PATCHKIT_STRICT", " ", "whitespace only"),
    ("PATCHKIT_LOG_LEVEL", "\u00b2", "accepted: DEBUG"),  # '²': str.isdigit() says yes, int() raises
    ("PATCHKIT_LOG_LEVEL", "\uff11\uff10", "accepted: DEBUG"),  # full-width '１０': int() reads 10
    ("PATCHKIT_LOG_LEVEL", "\u0663", "accepted: DEBUG"),  # Arabic-Indic '٣': int() reads 3
    ("PATCHKIT_LOG_LEVEL", "51", "accepted: DEBUG"),
    ("PATCHKIT_LOG_LEVEL", " ", "whitespace only"),
    ("PATCHKIT_EXTRA_PATCHES", "a,,b", "empty entry"),
    ("PATCHKIT_EXTRA_PATCHES", "a/b", "bad entry"),
    ("PATCHKIT_AUTOLOAD", "maybe", "accepted: 1, true"),
    ("PATCHKIT_MANIFEST_DIR", " ", "whitespace only"),
    ("PATCHKIT_MANIFEST_DIR", " logs", "without surrounding whitespace"),
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
    with pytest.warns(PatchkitWarning, match=variable):
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
    with pytest.warns(PatchkitWarning, match="did you mean" if suggestion else variable):
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


@pytest.mark.parametrize("variable, value, problem", MALFORMED)
def test_every_variable_has_one_parser_with_one_typed_error(variable, value, problem):
    with pytest.raises(ConfigError, match=problem) as raised:
        settings.from_environment({variable: value})
    assert raised.value.variable == variable


@pytest.mark.parametrize("value, level", [("debug", 10), (" WARNING ", 30), ("0", 0), ("50", 50), ("", None)])
def test_log_level_accepts_names_and_ascii_numbers(value, level):
    assert settings.from_environment({"PATCHKIT_LOG_LEVEL": value}).log_level == level


@pytest.mark.parametrize("variable, value", [("PATCHKIT_DISABLE", "toy..forward"), ("PATCHKIT_STRICT", "maybe"),
                                             ("PATCHKIT_LOG_LEVEL", "\u00b2")])
def test_apply_by_id_with_a_malformed_variable_records_config_error_unless_strict(toy, monkeypatch, variable, value):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    with pytest.warns(PatchkitWarning, match=variable):
        (record,) = engine.apply("toy.forward")
    assert (record.state, record.reason) == (State.SKIPPED, Reason.CONFIG_ERROR) and variable in record.detail
    if variable != "PATCHKIT_STRICT":
        with pytest.raises(ConfigError, match=variable):
            engine.apply("toy.forward", strict=True)


def test_apply_with_an_unknown_explicit_id_still_raises(toy):
    engine, core = toy
    with pytest.raises(UnknownPatchError, match="toy.forwrd"):
        engine.apply("toy.forwrd")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PATCHKIT_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**clean, **env})


def test_malformed_extra_patches_gives_config_error_records_and_a_running_host():
    code = ("import json, patchkit; records = patchkit.apply_all();"
            "print(json.dumps(sorted({(r.state.value, r.reason.value if r.reason else None) for r in records})))")
    result = _python(code, PATCHKIT_EXTRA_PATCHES="a,,b")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [["skipped", "config_error"]]
    strict = _python(code, PATCHKIT_EXTRA_PATCHES="a,,b", PATCHKIT_STRICT="1")
    assert strict.returncode == 1 and "ConfigError: PATCHKIT_EXTRA_PATCHES='a,,b'" in strict.stderr


@pytest.mark.parametrize("variable, value", [("PATCHKIT_DISABLE", "megatron.mtp_postproces"),
                                             ("PATCHKIT_STRICT", "ture")])
def test_a_typo_that_disables_patches_is_shown_once_without_any_logging_configured(variable, value):
    code = "import patchkit; patchkit.apply_all(); patchkit.apply_all(); print('host ran')"
    result = _python(code, **{variable: value})
    assert result.returncode == 0 and result.stdout.strip() == "host ran"
    lines = [line for line in result.stderr.splitlines() if "PatchkitWarning" in line]
    assert len(lines) == 1, result.stderr
    assert f"nothing applied: {variable}={value!r}" in lines[0] and lines[0].startswith("<string>:1:")


def test_the_config_warning_can_be_filtered_by_category():
    code = ("import warnings, patchkit; warnings.filterwarnings('ignore', category=patchkit.PatchkitWarning);"
            "patchkit.apply_all()")
    result = _python(code, PATCHKIT_DISABLE="megatron/mtp")
    assert result.returncode == 0 and result.stderr == ""


@pytest.mark.parametrize("variable, value, expected", [
    (settings.MTP_OUTPUT_HEAD, "", "detached"), (settings.MTP_OUTPUT_HEAD, "  ", "detached"),
    (settings.MTP_OUTPUT_HEAD, " Trained ", "trained"), (settings.MTP_OUTPUT_HEAD, "DETACHED", "detached"),
    (settings.MTP_WITHOUT_LABELS, "", "skip"), (settings.MTP_WITHOUT_LABELS, "Derive", "derive"),
])
def test_a_choice_variable_takes_its_choices_in_any_case_and_defaults_to_the_first(variable, value, expected):
    assert settings.parse_choice(variable, value) == expected
    assert settings.choice(variable, {variable: value}) == expected
    assert settings.choice(variable, {}) == settings.CHOICES[variable][0]


@pytest.mark.parametrize("variable, value", [
    (settings.MTP_OUTPUT_HEAD, "nope"), (settings.MTP_OUTPUT_HEAD, "detached,trained"),
    (settings.MTP_WITHOUT_LABELS, "skipp"), (settings.MTP_WITHOUT_LABELS, "derive\0"),
])
def test_a_bad_choice_is_a_config_error_naming_the_variable_and_the_choices(variable, value):
    with pytest.raises(ConfigError) as caught:
        settings.choice(variable, {variable: value})
    assert caught.value.variable == variable and caught.value.value == value
    assert ", ".join(settings.CHOICES[variable]) in str(caught.value)


def test_no_module_but_settings_reads_a_patchkit_variable_from_the_environment():
    # One parser: a PATCHKIT_* name spelled out as a string anywhere else in the package or the
    # catalogue is a second place that reads it. (PATCHKIT_AUTOLOAD_ACTIVE is autoload's own marker,
    # set and read by it alone, not a setting.)
    import ast
    from pathlib import Path

    root = Path(settings.__file__).resolve().parents[2]
    wrong = []
    for path in sorted([*(root / "patchkit").rglob("*.py"), *(root / "patches").rglob("*.py")]):
        if path.name == "settings.py" and path.parent.name == "runtime":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith("PATCHKIT_") and node.value != "PATCHKIT_AUTOLOAD_ACTIVE"
                    and " " not in node.value):
                wrong.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    assert not wrong
