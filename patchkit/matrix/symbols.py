"""What a source file says about one symbol, read with :mod:`ast` and never imported.

For a ``module:Qualname`` target: whether it is defined there (or inherited from a base class
defined in the same module, or imported there from another module), its signature, its
fingerprint (:mod:`patchkit.runtime.fingerprint`) and a hash of its source text, which unlike the
fingerprint also moves on docstring and formatting edits.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ..runtime.declaration import Target
from ..runtime.fingerprint import locate, nested_statements, node_fingerprint, parse_file

PRESENT = "present"
ABSENT = "absent"
INHERITED = "inherited"
IMPORTED = "imported"  #: bound by ``from X import name``; ``defined_at`` says ``X:qualname``


@dataclass(frozen=True)
class SymbolFacts:
    """One symbol in one release. ``defined_at`` is the qualname where the code lives."""

    status: str
    defined_at: str | None = None
    signature: str | None = None
    #: The signature without annotations: what callers depend on (names, kinds, defaults).
    call_signature: str | None = None
    fingerprint: str | None = None
    text_hash: str | None = None


def _argument(arg: ast.arg, default: ast.expr | None, annotated: bool) -> str:
    text = arg.arg
    if annotated and arg.annotation is not None:
        text += f": {ast.unparse(arg.annotation)}"
    if default is not None:
        text += f"={ast.unparse(default)}"
    return text


def render_signature(node: ast.AST, annotated: bool = True) -> str:
    """``(a, b: int=1, *, c=None, **kw) -> T`` for a def; ``class Name(Base)`` for a class."""
    if isinstance(node, ast.ClassDef):
        bases = [ast.unparse(b) for b in node.bases] + [ast.unparse(k) for k in node.keywords]
        return f"class {node.name}({', '.join(bases)})" if bases else f"class {node.name}"
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    args = node.args
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    parts = [_argument(a, d, annotated) for a, d in zip(positional, defaults, strict=True)]
    if args.posonlyargs:
        parts.insert(len(args.posonlyargs), "/")
    if args.vararg is not None:
        parts.append("*" + _argument(args.vararg, None, annotated))
    elif args.kwonlyargs:
        parts.append("*")
    parts += [_argument(a, d, annotated) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        parts.append("**" + _argument(args.kwarg, None, annotated))
    returns = f" -> {ast.unparse(node.returns)}" if annotated and node.returns is not None else ""
    return f"({', '.join(parts)}){returns}"


def text_hash(node: ast.stmt, source: str) -> str:
    """sha1 of the node's dedented source text from its ``def``/``class`` line, no final newline,
    first 7 hex digits: the upstream drift report's hashes, so the two can be compared.

    The report says its hashes include decorators, but they start at the ``def`` line: its hash of
    the ``@staticmethod`` ``MTPLossLoggingHelper.save_loss_to_tracker`` (megatron-core 0.14-0.19)
    matches only without the decorator line. The fingerprint, which is what drift uses, does
    include decorators.
    """
    lines = source.splitlines(keepends=True)
    text = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno])).rstrip("\n")
    return hashlib.sha1(text.encode()).hexdigest()[:7]


def _class_bases(cls: ast.ClassDef) -> list[str]:
    return [base.id for base in cls.bases if isinstance(base, ast.Name)]


def _find(tree: ast.Module, path: Sequence[str],
          seen: frozenset[str] = frozenset()) -> tuple[ast.stmt, tuple[str, ...]] | None:
    """The node for ``path``, following base classes defined in the same module for a member."""
    node = locate(tree, path)
    if isinstance(node, ast.stmt):
        return node, tuple(path)
    if len(path) < 2:
        return None
    owner = locate(tree, path[:-1])
    if not isinstance(owner, ast.ClassDef):
        return None
    for base in _class_bases(owner):
        if base in seen or locate(tree, (base,)) is None:
            continue
        found = _find(tree, (base, path[-1]), seen | {owner.name})
        if found is not None:
            return found
    return None


def inspect_file(path: Path | None, qualname: Sequence[str]) -> SymbolFacts:
    """The facts about ``qualname`` in the module source file ``path`` (None: module absent)."""
    if path is None:
        return SymbolFacts(ABSENT)
    tree = parse_file(path)
    found = _find(tree, qualname)
    if found is None:
        return SymbolFacts(ABSENT)
    node, where = found
    source = Path(path).read_text(encoding="utf-8")
    return SymbolFacts(
        status=PRESENT if tuple(where) == tuple(qualname) else INHERITED,
        defined_at=".".join(where),
        signature=render_signature(node),
        call_signature=render_signature(node, annotated=False),
        fingerprint=node_fingerprint(node),
        text_hash=text_hash(node, source),
    )


def _imported(tree: ast.Module, name: str, module: str, is_package: bool) -> tuple[str, str] | None:
    """Where ``from X import name`` (or ``... as name``) in ``module`` takes ``name`` from."""
    for statement in nested_statements(tree.body):
        if not isinstance(statement, ast.ImportFrom):
            continue
        for alias in statement.names:
            if (alias.asname or alias.name) != name:
                continue
            if statement.level:
                parts = module.split(".")
                package = parts if is_package else parts[:-1]
                base = ".".join(package[:len(package) - (statement.level - 1)])
                source = f"{base}.{statement.module}" if statement.module else base
            else:
                source = statement.module or ""
            return source, alias.name
    return None


def inspect_target(module_file: Callable[[str], Path | None], target: Target, depth: int = 0) -> SymbolFacts:
    """The facts about ``target``, following ``from X import name`` re-exports to the definition.

    ``module_file`` finds a module's source file (in an unpacked artifact, or installed). Patching a
    re-exported name rebinds it where the target module's code looks it up, so the code it stands
    for is the definition's, and its fingerprint is the definition's: the same one the engine
    computes from the live object.
    """
    path = module_file(target.module)
    facts = inspect_file(path, target.path)
    if facts.status != ABSENT or path is None or depth >= 5:
        return facts
    origin = _imported(parse_file(path), target.path[0], target.module, path.name == "__init__.py")
    if origin is None:
        return facts
    module, name = origin
    found = inspect_target(module_file, Target(module, (name, *target.path[1:])), depth + 1)
    if found.status == ABSENT:
        return found
    return dataclasses.replace(found, status=IMPORTED, defined_at=f"{module}:{found.defined_at}")
