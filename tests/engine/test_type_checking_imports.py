"""Names the runtime imports only for the type checker are never used when the code runs.

Start-up imports no ``typing``: modules import their annotation types under ``if TYPE_CHECKING:``
(``TYPE_CHECKING = False``), and with ``from __future__ import annotations`` annotations never
evaluate them. A use outside an annotation (``isinstance(x, Mapping)``) would raise ``NameError``
only on the path that reaches it, typically an error path no other test takes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import patchkit

PACKAGE = Path(patchkit.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imported(nodes: list[ast.stmt] | ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(nodes) if isinstance(nodes, ast.AST) else (n for s in nodes for n in ast.walk(s)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return found


def runtime_uses_of_type_checking_names(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    blocks = [node for node in ast.walk(tree) if _is_type_checking_block(node)]
    only_for_types = _imported([s for block in blocks for s in block.body])  # type: ignore[attr-defined]
    skipped = {id(n) for block in blocks for n in ast.walk(block)}
    for node in ast.walk(tree):
        for annotation in (getattr(node, "annotation", None), getattr(node, "returns", None)):
            if annotation is not None:
                skipped.update(id(n) for n in ast.walk(annotation))
    found = []

    def visit(node: ast.AST, bound: set[str]) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # imported where it is used, or a parameter of that name: fine
            bound = bound | _imported(node) | {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        used = isinstance(node, ast.Name) and node.id in only_for_types and id(node) not in skipped
        if used and node.id not in bound:  # type: ignore[attr-defined]
            found.append((node.lineno, node.id))
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    module_level = _imported([s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))])
    visit(tree, module_level)
    return found


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_name_imported_for_the_type_checker_is_used_at_run_time(path: Path) -> None:
    assert runtime_uses_of_type_checking_names(path.read_text(encoding="utf-8")) == []


def test_the_scan_finds_a_type_checking_name_used_at_run_time() -> None:
    source = ("from __future__ import annotations\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n"
              "    from typing import Mapping\n\ndef f(x: Mapping) -> bool:\n    return isinstance(x, Mapping)\n\n"
              "def g(x: Mapping) -> bool:\n    from collections.abc import Mapping\n"
              "    return isinstance(x, Mapping)\n")
    assert runtime_uses_of_type_checking_names(source) == [(7, "Mapping")]
