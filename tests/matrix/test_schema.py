"""Malformed matrix files: each problem names its line:column, the path to the value, and what was expected."""

from __future__ import annotations

import pytest

from patchkit.matrix import MatrixError, load
from patchkit.matrix.schema import parse
from patchkit.runtime.errors import PatchkitError

GOOD_ENV = """schema: 1
environments:
  engine:
    install: []
    tests: [tests/engine]
"""

MALFORMED = {
    "yaml syntax": ("schema: 1\nenvironments: [unclosed\n", 3, 1, "YAML syntax: expected well-formed YAML"),
    "schema version": ("schema: 2\nenvironments: {}\n", 1, 9, "schema: expected 1"),
    "missing environments": ("schema: 1\n", 1, 1, "the file: expected a key 'environments'"),
    "unknown top-level key": (GOOD_ENV + "enviroments: {}\n", 6, 1,
                              "the file.enviroments: expected one of schema, environments, patches"),
    "empty tests": ("schema: 1\nenvironments:\n  e:\n    install: []\n    tests: []\n", 5, 12,
                    "environments.e.tests: expected at least one test path, found an empty list"),
    "install step not a list": ("schema: 1\nenvironments:\n  e:\n    install: [torch==2.13.0]\n    tests: [t]\n",
                                4, 15, "environments.e.install[0]: expected a list of pip arguments, found a string"),
    "ci not a boolean": (GOOD_ENV + "    ci: maybe\n", 6, 9, "environments.engine.ci: expected true or false"),
    "unquoted python": (GOOD_ENV + "    python: 3.12\n", 6, 13,
                        'environments.engine.python: expected a quoted Python version such as "3.12"'),
    "duplicate environment": (GOOD_ENV + "  engine:\n    install: []\n    tests: [x]\n", 6, 3,
                              "environments.engine: expected each key once (first at line 3)"),
    "bad environment name": ("schema: 1\nenvironments:\n  Mega Core:\n    install: []\n    tests: [t]\n", 3, 3,
                             "expected an environment name of lowercase letters"),
    "unquoted version": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {megatron-core: 0.20}\n"
                         "        status: verified\n", 9, 35, "expected a quoted version string (write '0.20'"),
    "not a PEP 440 version": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: 'zero.one'}\n"
                              "        status: verified\n", 9, 26, "expected a PEP 440 version, found 'zero.one'"),
    "unknown status": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: '0.12.0'}\n"
                       "        status: works\n", 10, 17,
                       "patches.megatron.mtp.v[0].status: expected one of verified, native, unsupported, known-bad"),
    "missing status": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: '0.12.0'}\n", 9, 9,
                       "patches.megatron.mtp.v[0]: expected a key 'status'"),
    "bad fingerprint": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: '0.12.0'}\n"
                        "        status: verified\n        targets:\n          'a.b:C.f': {fingerprint: ABC}\n",
                        12, 36, "fingerprint: expected 16 lowercase hex digits, found a string 'ABC'"),
    "bad target": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: '0.12.0'}\n"
                   "        status: verified\n        targets:\n          'not a target': {}\n",
                   12, 11, "expected a target 'package.module:Qualname.attr', found 'not a target'"),
    "bad verified_by": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - versions: {vllm: '0.12.0'}\n"
                        "        status: verified\n        verified_by: [ci]\n", 11, 23,
                        "verified_by[0]: expected 'static', 'tests:<environment>' or 'doctor:<host>'"),
    "record not a mapping": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v:\n      - vllm 0.12.0\n", 9, 9,
                             "expected a version record (a mapping with 'versions' and 'status')"),
    "records not a list": (GOOD_ENV + "patches:\n  megatron.mtp:\n    v: {versions: {}}\n", 8, 8,
                           "patches.megatron.mtp.v: expected a list of version records, found a mapping"),
    "bad patch id": (GOOD_ENV + "patches:\n  MTP:\n    v: []\n", 7, 3, "expected a patch id like 'upstream.name'"),
    "empty document": ("", 1, 1, "the file: expected a mapping with 'schema' and 'environments'"),
}


@pytest.mark.parametrize("text, line, column, message", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_matrix_names_position_and_expectation(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(MatrixError) as caught:
        parse(text, "m.yaml")
    problems = [str(p) for p in caught.value.problems]
    assert any(p.startswith(f"m.yaml:{line}:{column}: ") and message in p for p in problems), problems
    assert isinstance(caught.value, PatchkitError) and isinstance(caught.value, ValueError)


def test_every_problem_in_the_file_is_reported_at_once() -> None:
    text = (GOOD_ENV + "    ci: maybe\npatches:\n  megatron.mtp:\n    v:\n"
            "      - versions: {vllm: 0.20}\n        status: x\n")
    with pytest.raises(MatrixError) as caught:
        parse(text, "m.yaml")
    assert [(p.position.line, p.position.column) for p in caught.value.problems] == [(6, 9), (10, 26), (11, 17)]
    assert "3 problem(s)" in str(caught.value)


def test_the_repository_matrix_is_valid_and_shipped_with_the_package() -> None:
    matrix = load()
    assert matrix.schema == 1
    assert matrix.environments["matrix"].tests == ("tests/matrix", "tests/devtools", "tests/docs")
    assert matrix.environments["matrix"].ci is True


def test_a_valid_record_reads_back_as_data() -> None:
    text = GOOD_ENV + ("patches:\n  megatron.mtp:\n    'megatron-core>=0.14,<0.17':\n"
                       "      - versions: {megatron-core: '0.16.1'}\n        status: verified\n"
                       "        verified_by: ['tests:engine', static]\n        targets:\n"
                       "          'megatron.core.x:GPTModel._postprocess': {fingerprint: 0123456789abcdef, "
                       "signature: '(self, x)'}\n")
    (record,) = parse(text).records("megatron.mtp", "megatron-core>=0.14,<0.17")
    assert record.versions == {"megatron-core": "0.16.1"}
    assert record.verified_by == ("tests:engine", "static")
    assert record.targets["megatron.core.x:GPTModel._postprocess"].fingerprint == "0123456789abcdef"
    assert record.position is not None and record.position.line == 9


@pytest.mark.parametrize("text", ["schema: 0x1\nenvironments: {}\n", "schema: 1:00\nenvironments: {}\n",
                                  "schema: 0o1\nenvironments: {}\n", "schema: 1_0\nenvironments: {}\n"])
def test_yaml_1_1_integers_are_reported_never_converted(text):
    with pytest.raises(MatrixError) as raised:
        parse(text, "m.yaml")
    (problem,) = raised.value.problems
    assert (problem.position.line, problem.position.column, problem.where) == (1, 9, "schema")


def test_anchors_and_aliases_still_compose():
    text = GOOD_ENV + "  other:\n    install: &steps [[torch==2.13.0]]\n    tests: [t]\n  third:\n" \
                      "    install: *steps\n    tests: [t]\n"
    matrix = parse(text, "m.yaml")
    assert matrix.environments["third"].install == matrix.environments["other"].install == (("torch==2.13.0",),)


@pytest.mark.parametrize("text, expected", [
    ("a: *nowhere\n", "undefined alias"),
    ("schema: 1\n---\nschema: 1\n", "another document"),
    ("schema: \x07\n", "character"),
])
def test_composer_errors_are_matrix_errors_with_positions(text, expected):
    with pytest.raises(MatrixError, match=expected):
        parse(text, "m.yaml")


def test_an_environment_runs_on_the_python_it_names_and_on_3_11_otherwise():
    matrix = parse(GOOD_ENV + '  mcore:\n    python: "3.12"\n    install: []\n    tests: [t]\n', "m.yaml")
    assert matrix.environments["mcore"].python == "3.12"
    assert matrix.environments["engine"].python == "3.11"
