"""Every shipped patch can be proven by `patchkit doctor`, and no self-check can pass vacuously.

Read statically (no upstream needed): each declared patch names a self-check that is a function of
its family's ``_checks`` package, and at least one test marked ``@pytest.mark.breaks(<id>)`` puts
upstream's behaviour back in the patch's place and expects that check to fail. Those tests run in
their upstream's environment (tests/megatron, tests/bridge, tests/modelopt, tests/vllm).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

import pytest

from patchkit.runtime.catalogue import scan

TESTS = Path(__file__).resolve().parents[1]


def shipped():
    registered, errors = scan()
    assert not errors, errors
    return registered


def functions_of(module_file: Path) -> set[str]:
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


@functools.lru_cache(maxsize=None)
def broken_tests(tests: Path = TESTS) -> dict[str, list[str]]:
    """patch id -> the tests marked ``@pytest.mark.breaks(<id>)``, from every test module's source: as a
    decorator, or on a case of a parametrised test (``pytest.param(..., marks=pytest.mark.breaks(<id>))``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in (c for decorator in node.decorator_list for c in ast.walk(decorator)):
                if (isinstance(call, ast.Call) and ast.unparse(call.func) == "pytest.mark.breaks"
                        and call.args and isinstance(call.args[0], ast.Constant)):
                    found.setdefault(call.args[0].value, []).append(f"{path.relative_to(tests)}::{node.name}")
    return found


def test_the_catalogue_is_not_empty():
    assert len(shipped()) >= 10


@pytest.mark.parametrize("registered", shipped(), ids=lambda r: r.patch.id)
def test_every_patch_declares_a_self_check_beside_its_implementation(registered):
    reference = registered.patch.self_check
    assert isinstance(reference, str), f"{registered.patch.id} declares no self_check"
    module, _, function = reference.partition(":")
    assert module.startswith("._checks."), f"{registered.patch.id}: self-checks live in its family's _checks package"
    spec = importlib.util.find_spec(registered.package)
    assert spec is not None and spec.submodule_search_locations
    checks = Path(next(iter(spec.submodule_search_locations)), *module[1:].split(".")).with_suffix(".py")
    assert function in functions_of(checks), f"{registered.patch.id}: {checks} defines no {function}()"


@pytest.mark.parametrize("registered", shipped(), ids=lambda r: r.patch.id)
def test_every_patch_has_a_test_that_breaks_it_and_expects_its_check_to_fail(registered):
    assert registered.patch.id in broken_tests(), (
        f"no test is marked @pytest.mark.breaks({registered.patch.id!r}): write one that puts upstream's "
        "behaviour back (patchkit.selfcheck.upstream_behaviour, or take a native feature away) and expects "
        "the doctor's verdict 'failed' with expected and found")


def test_a_breaks_mark_on_a_parametrised_case_counts(tmp_path):
    (tmp_path / "test_toy.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.parametrize('case', [pytest.param(1, marks=pytest.mark.breaks('toy.a')), 2])\n"
        "def test_cases(case):\n    pass\n\n\n"
        "@pytest.mark.breaks('toy.b')\ndef test_one():\n    pass\n", encoding="utf-8")
    assert broken_tests(tmp_path) == {"toy.a": ["test_toy.py::test_cases"], "toy.b": ["test_toy.py::test_one"]}


def test_every_breaks_marker_names_a_shipped_patch():
    ids = {r.patch.id for r in shipped()}
    assert {pid: tests for pid, tests in broken_tests().items() if pid not in ids} == {}
