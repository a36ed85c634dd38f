"""Malformed PATCHKIT_* values, unknown ids and names: each said once, costing only what it is about."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from patchkit import ConfigError, Patch, PatchkitWarning, Reason, Replace, State, UnknownPatchError, Variant
from patchkit.runtime import engine as engine_module
from patchkit.runtime import settings


@pytest.fixture(autouse=True)
def _each_test_reports_afresh(monkeypatch):
    """Problems are said once per process: each test starts as a fresh process would."""
    monkeypatch.setattr(engine_module, "_reported_problems", set(), raising=False)


def forward(self, x):
    return "patched"


@pytest.fixture
def toy(engine, make_upstream):
    up = make_upstream()
    core = up.import_core()
    for patch_id in ("toy.forward", "toy.backward"):
        attr = patch_id.split(".")[1]
        engine.register(Patch(id=patch_id, summary="s", why="w", upstream="u", removal="r",
                              variants=(Variant(requires={up.name: ">=1"},
                                                installs=(Replace(up.target(f"Model.{attr}"), forward),)),)))
    return engine, core


@pytest.fixture
def with_opt_in(toy, make_upstream):
    """``toy`` plus an opt-in patch, toy.scale_opt_in."""
    engine, core = toy
    up_module = core.__name__
    engine.register(Patch(id="toy.scale_opt_in", summary="s", why="w", upstream="u", removal="r", opt_in=True,
                          variants=(Variant(requires={_dist_of(engine): ">=1"},
                                            installs=(Replace(f"{up_module}:Model.scale", staticmethod(forward)),)),)))
    return engine, core


def _dist_of(engine) -> str:
    return next(iter(engine.patch("toy.forward").variants[0].requires))


#: Switches saying which patches may apply: a value that cannot be read applies nothing.
SWITCHES_MALFORMED = [
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
    ("PATCHKIT_DISABLE", "tóy.forward", "bad entry"),
    ("PATCHKIT_DISABLE", "   ", "whitespace only"),
    ("PATCHKIT_ENABLE", "\t", "whitespace only"),
    ("PATCHKIT_AUTOLOAD", "maybe", "accepted: 1, true"),
]

#: Not a level name, nor a number logging knows.
BAD_LOG_LEVELS = (
    "verbose",
    "\u00b2",  # '²': str.isdigit() says yes
    "\uff11\uff10",  # full-width '１０'
    "\u0663",  # Arabic-Indic '٣': int() reads 3
    "51",
)

#: Everything else: a bad value costs only what it is about, every patch still applies.
LOCAL_MALFORMED = [
    ("PATCHKIT_FORCE", "toy.forward=1", "bad entry", "nothing forced"),
    ("PATCHKIT_FORCE", "$(whoami)", "bad entry", "nothing forced"),
    ("PATCHKIT_STRICT", "maybe", "accepted: 1, true", "strict mode is off"),
    ("PATCHKIT_STRICT", "2", "accepted: 1, true", "strict mode is off"),
    ("PATCHKIT_STRICT", " ", "whitespace only", "strict mode is off"),
    ("PATCHKIT_OPT_IN", "toy/forward", "bad entry", "no opt-in patch"),
    *(("PATCHKIT_LOG_LEVEL", level, "accepted: DEBUG", "keeps its level") for level in BAD_LOG_LEVELS),
    ("PATCHKIT_LOG_LEVEL", " ", "whitespace only", "keeps its level"),
    ("PATCHKIT_EXTRA_PATCHES", "a,,b", "empty entry", "no extra declaration module"),
    ("PATCHKIT_EXTRA_PATCHES", "a/b", "bad entry", "no extra declaration module"),
    ("PATCHKIT_MANIFEST_DIR", " ", "whitespace only", "no manifest"),
    ("PATCHKIT_MANIFEST_DIR", " logs", "without surrounding whitespace", "no manifest"),
    ("PATCHKIT_MTP_OUTPUT_HEAD", "both", "accepted: detached, trained", "falls back to 'detached'"),
    ("PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES", "1GiB", "accepted: a positive whole number", "the default chunk"),
    ("PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES", "0", "accepted: a positive whole number", "the default chunk"),
    ("PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES", "\u0663", "accepted: a positive whole number", "the default chunk"),
]

MALFORMED = SWITCHES_MALFORMED + [case[:3] for case in LOCAL_MALFORMED]

UNKNOWN = [
    ("PATCHKIT_DISABLE", "toy.forwrd", "toy.forward"),
    ("PATCHKIT_ENABLE", "toy.backwards", "toy.backward"),
    ("PATCHKIT_FORCE", "megatron.nothing", None),
]


@pytest.mark.parametrize("variable, value, problem", SWITCHES_MALFORMED)
def test_an_unreadable_switch_applies_nothing_and_names_the_variable(toy, monkeypatch, variable, value, problem):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    original = core.Model.__dict__["forward"]
    with pytest.warns(PatchkitWarning, match=f"{variable}.*nothing applied") as said:
        records = engine.apply_all()  # no exception: the host process carries on
    assert len(said) == 1
    assert {r.state for r in records} == {State.SKIPPED}
    assert {r.reason for r in records} == {Reason.CONFIG_ERROR}
    assert variable in records[0].detail and problem in records[0].detail and "accepted" in records[0].detail
    assert core.Model.__dict__["forward"] is original
    assert [p.variable for p in engine.config_problems()] == [variable]


@pytest.mark.parametrize("variable, value, problem, cost", LOCAL_MALFORMED)
def test_any_other_bad_value_disables_no_patch_and_says_what_it_costs(toy, monkeypatch, variable, value, problem,
                                                                     cost):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    with pytest.warns(PatchkitWarning, match=variable) as said:
        records = engine.apply_all()
    assert len(said) == 1 and problem in str(said[0].message) and cost in str(said[0].message)
    assert {r.state for r in records} == {State.APPLIED}
    assert core.Model().forward(1) == "patched"
    assert [p.variable for p in engine.config_problems()] == [variable]


def test_a_bad_log_level_keeps_the_loggers_level(toy, monkeypatch):
    engine, core = toy
    import logging

    logging.getLogger("patchkit").setLevel(logging.ERROR)
    try:
        monkeypatch.setenv("PATCHKIT_LOG_LEVEL", "verbose")
        with pytest.warns(PatchkitWarning, match="PATCHKIT_LOG_LEVEL='verbose'"):
            engine.apply_all()
        assert logging.getLogger("patchkit").level == logging.ERROR
    finally:
        logging.getLogger("patchkit").setLevel(logging.NOTSET)


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
def test_unknown_id_suggests_the_closest_and_is_the_only_entry_ignored(toy, monkeypatch, variable, value, suggestion):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    with pytest.warns(PatchkitWarning, match="did you mean" if suggestion else variable) as said:
        records = engine.apply_all()
    assert len(said) == 1 and "this entry is ignored" in str(said[0].message)
    assert Reason.CONFIG_ERROR not in {r.reason for r in records}
    if suggestion:
        assert f"did you mean {suggestion}" in str(said[0].message)
    with pytest.raises(UnknownPatchError) as info:
        engine.apply_all(strict=True)
    assert info.value.patch_id == value


def test_an_unknown_id_beside_a_known_one_leaves_the_known_one_disabled(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "toy.forwrd,toy.backward")
    with pytest.warns(PatchkitWarning, match="did you mean toy.forward"):
        states = {r.id: (r.state, r.reason) for r in engine.apply_all()}
    assert states == {"toy.backward": (State.SKIPPED, Reason.DISABLED), "toy.forward": (State.APPLIED, None)}


def test_an_unknown_id_in_an_explicit_argument_raises_at_once(toy):
    engine, core = toy
    with pytest.raises(UnknownPatchError, match="did you mean toy.forward"):
        engine.apply_all(disable=["toy.forwrd"])


def test_a_misspelled_variable_name_is_pointed_at_the_documented_one(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLED", "toy.forward")
    with pytest.warns(PatchkitWarning, match="PATCHKIT_DISABLED.*did you mean PATCHKIT_DISABLE") as said:
        records = engine.apply_all()
    assert len(said) == 1 and "patchkit does not read this variable" in str(said[0].message)
    assert {r.state for r in records} == {State.APPLIED}
    engine.apply_all(strict=True)  # a misspelled name is said, never raised


def test_each_problem_is_said_once_however_many_calls_meet_it(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_LOG_LEVEL", "verbose")
    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        engine.apply_all()
        engine.apply_all()
        engine.apply("toy.forward")
    assert len(said) == 1


def test_opt_in_turns_on_an_opt_in_patch_without_restricting_the_others(with_opt_in, monkeypatch):
    engine, core = with_opt_in
    monkeypatch.setenv("PATCHKIT_OPT_IN", "toy.scale_opt_in")
    states = {r.id: r.state for r in engine.apply_all()}
    assert set(states.values()) == {State.APPLIED}


def test_the_opt_in_hint_says_exactly_what_turns_it_on_and_doing_it_works(with_opt_in, monkeypatch):
    engine, core = with_opt_in
    (record,) = [r for r in engine.apply_all() if r.id == "toy.scale_opt_in"]
    assert (record.state, record.reason) == (State.SKIPPED, Reason.OPT_IN)
    assert record.detail.endswith("enable with PATCHKIT_OPT_IN=toy.scale_opt_in")
    variable, value = record.detail.rsplit(" ", 1)[1].split("=")
    monkeypatch.setenv(variable, value)
    states = {r.id: r.state for r in engine.apply_all()}
    assert states == {"toy.backward": State.APPLIED, "toy.forward": State.APPLIED, "toy.scale_opt_in": State.APPLIED}


def test_a_glob_in_enable_never_turns_on_an_opt_in_but_its_exact_id_does(with_opt_in, monkeypatch):
    engine, core = with_opt_in
    monkeypatch.setenv("PATCHKIT_ENABLE", "toy.*")
    states = {r.id: r.reason for r in engine.apply_all()}
    assert states == {"toy.backward": None, "toy.forward": None, "toy.scale_opt_in": Reason.OPT_IN}
    engine.revert_all()
    monkeypatch.setenv("PATCHKIT_ENABLE", "toy.forward,toy.scale_opt_in")
    states = {r.id: r.state for r in engine.apply_all()}
    assert states == {"toy.backward": State.SKIPPED, "toy.forward": State.APPLIED, "toy.scale_opt_in": State.APPLIED}


def test_apply_by_glob_still_includes_opt_ins(with_opt_in):
    engine, core = with_opt_in
    assert {r.id: r.state for r in engine.apply("toy.*")}["toy.scale_opt_in"] is State.APPLIED


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_disabling_an_applied_patch_reverts_it(toy, monkeypatch, how):
    engine, core = toy
    original = core.Model.__dict__["forward"]
    engine.apply_all()
    assert core.Model().forward(1) == "patched"
    if how == "argument":
        records = engine.apply_all(disable=["toy.forward"])
    else:
        monkeypatch.setenv("PATCHKIT_DISABLE", "toy.forward")
        records = engine.apply_all()
    states = {r.id: (r.state, r.reason) for r in records}
    assert states["toy.forward"] == (State.SKIPPED, Reason.DISABLED)
    assert states["toy.backward"] == (State.APPLIED, None)
    assert core.Model.__dict__["forward"] is original and core.Model().forward(1) == 2


def test_malformed_log_level_is_rejected_with_the_accepted_forms():
    with pytest.raises(ConfigError, match="PATCHKIT_LOG_LEVEL.*DEBUG, INFO"):
        settings.from_environment({"PATCHKIT_LOG_LEVEL": "LOUD"})
    assert settings.from_environment({"PATCHKIT_LOG_LEVEL": "debug"}).log_level == 10


def test_glob_matching_nothing_only_warns(toy, monkeypatch):
    engine, core = toy
    monkeypatch.setenv("PATCHKIT_DISABLE", "vllm.*")
    with pytest.warns(PatchkitWarning, match="matching no known patch"):
        records = engine.apply_all()
    assert {r.state for r in records} == {State.APPLIED}


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


@pytest.mark.parametrize("variable, value, reason", [("PATCHKIT_DISABLE", "toy..forward", Reason.CONFIG_ERROR),
                                                     ("PATCHKIT_STRICT", "maybe", None),
                                                     ("PATCHKIT_LOG_LEVEL", "\u00b2", None)])
def test_apply_by_id_with_a_bad_variable_costs_what_apply_all_does(toy, monkeypatch, variable, value, reason):
    engine, core = toy
    monkeypatch.setenv(variable, value)
    with pytest.warns(PatchkitWarning, match=variable):
        (record,) = engine.apply("toy.forward")
    assert record.reason is reason and (reason is None or variable in record.detail)
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


def test_malformed_extra_patches_leaves_the_catalogue_applying_and_the_host_running():
    code = ("import json, patchkit; records = patchkit.apply_all();"
            "print(json.dumps(sorted({r.reason.value if r.reason else None for r in records} - {None})))")
    result = _python(code, PATCHKIT_EXTRA_PATCHES="a,,b")
    assert result.returncode == 0, result.stderr
    assert "config_error" not in json.loads(result.stdout)
    assert "PATCHKIT_EXTRA_PATCHES='a,,b'" in result.stderr and "no extra declaration module" in result.stderr
    strict = _python(code, PATCHKIT_EXTRA_PATCHES="a,,b", PATCHKIT_STRICT="1")
    assert strict.returncode == 1 and "ConfigError: PATCHKIT_EXTRA_PATCHES='a,,b'" in strict.stderr


STATES = ("import json, patchkit\n"
          "patchkit.apply_all()\n"
          "patchkit.apply_all()\n"
          "records = patchkit.apply_all()\n"
          "print(json.dumps(sorted({r.reason.value for r in records if r.reason})))\n")


@pytest.mark.parametrize("variable, value, said", [
    ("PATCHKIT_DISABLE", "megatron.mtp_postproces", "did you mean megatron.mtp_postprocess"),
    ("PATCHKIT_STRICT", "ture", "strict mode is off"),
    ("PATCHKIT_LOG_LEVEL", "verbose", "keeps its level"),
    ("PATCHKIT_DISABLED", "megatron.mtp_postprocess", "did you mean PATCHKIT_DISABLE"),
])
def test_a_typo_is_said_once_at_the_users_line_and_disables_no_other_patch(variable, value, said):
    result = _python(STATES, **{variable: value})
    assert result.returncode == 0, result.stderr
    assert "config_error" not in json.loads(result.stdout)
    lines = [line for line in result.stderr.splitlines() if "PatchkitWarning" in line]
    assert len(lines) == 1, result.stderr
    assert f"{variable}={value!r}" in lines[0] and said in lines[0] and lines[0].startswith("<string>:2:")


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


@pytest.mark.parametrize("value, chunk", [("", 1 << 30), ("4096", 4096), (" 512 ", 512), ("-1", 1 << 30),
                                          ("1e6", 1 << 30)])
def test_the_gradient_chunk_is_a_positive_byte_count_and_defaults_to_one_gib(value, chunk):
    assert settings.grad_allreduce_chunk_bytes({"PATCHKIT_GRAD_ALLREDUCE_CHUNK_BYTES": value}) == chunk
