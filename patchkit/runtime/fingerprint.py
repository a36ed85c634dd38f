"""Fingerprints of upstream code: a hash of the normalised syntax tree of one ``def`` or ``class``.

Two sources of the same release give the same fingerprint, whether the code is an installed module
or a file read from a downloaded artifact, because both go through :func:`source_fingerprint` on
the file's text. Docstrings, comments and formatting do not count: they are not in the tree
(comments, layout) or are removed from it (docstrings), so only a change to what the code does
moves the hash. Decorators, signatures and names do count.

Fingerprints are computed only when asked (at install time, and only for a variant the matrix has
fingerprints for), and cached per file version (path, size, mtime).
"""

from __future__ import annotations

import ast
import copy
import functools
import hashlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .declaration import Target

#: Hex digits kept from the sha256: 64 bits, ample for telling a handful of releases apart.
LENGTH = 16

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _strip_docstrings(node: ast.AST) -> ast.AST:
    for scope in ast.walk(node):
        if isinstance(scope, _SCOPES) and scope.body:
            first = scope.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                scope.body = scope.body[1:] or [ast.Pass()]
    return node


def node_fingerprint(node: ast.AST) -> str:
    """The fingerprint of a ``def``/``class`` node. ``node`` is not modified."""
    stripped = _strip_docstrings(copy.deepcopy(node))
    dump = ast.dump(stripped, annotate_fields=False, include_attributes=False)
    return hashlib.sha256(dump.encode()).hexdigest()[:LENGTH]


def nested_statements(body: Sequence[ast.stmt]) -> list[ast.stmt]:
    """Statements of ``body``, looking into ``if``/``try``/``with`` blocks that define names too."""
    found: list[ast.stmt] = []
    for statement in body:
        found.append(statement)
        if isinstance(statement, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                found.extend(nested_statements(getattr(statement, block, [])))
            for handler in getattr(statement, "handlers", []):
                found.extend(nested_statements(handler.body))
    return found


def locate(tree: ast.Module, path: Sequence[str]) -> ast.AST | None:
    """The ``def``/``class`` at ``path`` (``("Class", "method")``) in ``tree``; the last one wins,
    as it would when the module runs."""
    scope: ast.AST = tree
    for name in path:
        matches = [s for s in nested_statements(getattr(scope, "body", []))
                   if isinstance(s, _DEFINITIONS) and s.name == name]
        if not matches:
            return None
        scope = matches[-1]
    return scope


@functools.lru_cache(maxsize=64)
def _parsed(path: str, size: int, mtime_ns: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def parse_file(path: str | os.PathLike[str]) -> ast.Module:
    """The syntax tree of a source file, cached until the file changes."""
    stat = os.stat(path)
    return _parsed(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1024)
def _cached_file_fingerprint(path: str, size: int, mtime_ns: int, qualname: tuple[str, ...]) -> str | None:
    node = locate(_parsed(path, size, mtime_ns), qualname)
    return None if node is None else node_fingerprint(node)


def file_fingerprint(path: str | os.PathLike[str], qualname: Sequence[str]) -> str | None:
    """The fingerprint of ``qualname`` defined in the source file ``path``; None if it is not there."""
    stat = os.stat(path)
    return _cached_file_fingerprint(str(path), stat.st_size, stat.st_mtime_ns, tuple(qualname))


def source_fingerprint(source: str, qualname: Sequence[str]) -> str | None:
    """The fingerprint of ``qualname`` defined in module source text ``source``."""
    node = locate(ast.parse(source), qualname)
    return None if node is None else node_fingerprint(node)


def module_file(module: str) -> str | None:
    """The source file of ``module``: from the imported module if it is imported, else its spec."""
    imported = sys.modules.get(module)
    origin = getattr(imported, "__file__", None) if imported is not None else None
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def target_fingerprint(target: Target) -> str | None:
    """The fingerprint of the code now installed at ``target``, or None if it has no readable source.

    The target is looked up where it is declared (its module's file, walking the qualname); a
    target defined elsewhere (an inherited method, a re-exported function) is found through the
    object's own ``__module__``/``__qualname__``.
    """
    path = module_file(target.module)
    if path is not None:
        found = file_fingerprint(path, target.path)
        if found is not None:
            return found
    return _object_fingerprint(target)


def _object_fingerprint(target: Target) -> str | None:
    obj: Any = sys.modules.get(target.module)
    for name in target.path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    obj = getattr(obj, "__func__", obj)
    if callable(obj):
        obj = inspect.unwrap(obj)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        return None
    path = module_file(module)
    return None if path is None else file_fingerprint(path, qualname.split("."))
