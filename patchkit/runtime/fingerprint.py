"""Fingerprints of upstream code: a hash of a canonical form of one ``def`` or ``class``.

The fingerprint is a function of the source text alone: the same on Python 3.10, 3.11, 3.12 and
3.13, whether the code is an installed module or a file read from a downloaded artifact.

Why a canonical AST walk, not ``ast.dump`` and not tokens
    ``ast.dump`` prints whatever fields the running interpreter's node classes have: 3.12 added
    ``type_params`` to every ``def``/``class`` (empty unless PEP 695 syntax is used), and 3.13's
    ``dump`` leaves out empty and None fields that 3.12 prints. The same file therefore hashed
    differently on each Python, and every 3.12 user saw false drift. A token stream is no better:
    3.12 tokenizes f-strings into ``FSTRING_START``/``MIDDLE``/``END`` where 3.11 has one
    ``STRING``, and tokens keep redundant parentheses and line continuations, which are layout.
    So :func:`canonical` walks the tree itself and writes each node as its class name and its
    fields *by name, in sorted order*, leaving out every field whose value is None or an empty
    list. A field a newer Python adds is always empty or None for code older Pythons can parse
    (that is how the grammar stays backward compatible), so it never reaches the hash; and a field
    that is set (a real type parameter list) is kept, so such code still hashes by what it says.
    Two more fields are dropped as spelling, not code: ``Constant.kind`` (the ``u`` prefix) and
    ``type_comment``. Adjacent string parts of an f-string are merged and empty ones dropped, the
    one place where parsers of different versions split the same text differently.

What counts
    Docstrings, comments and formatting do not: comments and layout are not in the tree, and
    docstrings are removed from it. Decorators, signatures, names, constants and code do.

Costs
    Parsing a large upstream module takes tens of milliseconds, so fingerprints are computed only
    when asked, cached in memory per file identity (path, size, mtime, ctime, inode), and, for the
    engine's drift check, on disk too, keyed by the file's content hash
    (:mod:`patchkit.runtime.fpcache`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .declaration import Target

#: Hex digits kept from the sha256: 64 bits, ample for telling a handful of releases apart.
LENGTH = 16
#: Mixed into every hash: a new canonical form gets a new FORMAT, so fingerprints of two forms never
#: compare equal by accident. 2: the interpreter-independent walk (1 was ``ast.dump``).
FORMAT = 2

_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_SCOPES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
#: Fields that spell code rather than say what it does.
_IGNORED_FIELDS = frozenset({"kind", "type_comment"})
#: Blocks whose statements run in the enclosing scope, so definitions in them count (TryStar: 3.11+).
_BLOCKS = (ast.If, ast.Try, ast.With, getattr(ast, "TryStar", ast.Try))


def _is_docstring(statement: ast.stmt) -> bool:
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def _joined_parts(values: list[ast.expr]) -> list[ast.expr]:
    """The parts of an f-string with adjacent string constants merged and empty ones dropped."""
    merged: list[ast.expr] = []
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not value.value:
                continue
            last = merged[-1] if merged else None
            if isinstance(last, ast.Constant) and isinstance(last.value, str):
                merged[-1] = ast.Constant(last.value + value.value)
                continue
        merged.append(value)
    return merged


def _write(node: Any, out: list[str]) -> None:
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name in sorted(node._fields):
            if name in _IGNORED_FIELDS:
                continue
            value = getattr(node, name, None)
            if value is None or (isinstance(value, list) and not value):
                continue
            if name == "body" and isinstance(node, _SCOPES) and value and _is_docstring(value[0]):
                value = value[1:] or [ast.Pass()]
            elif name == "values" and isinstance(node, ast.JoinedStr):
                value = _joined_parts(value)
            out.append(name)
            out.append("=")
            _write(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _write(item, out)
            out.append(",")
        out.append("]")
    else:  # a constant, an identifier, an operator's int: its type and repr say it exactly
        out.append(f"{type(node).__name__}:{node!r}")


def canonical(node: ast.AST) -> str:
    """The interpreter-independent text form of ``node`` that fingerprints hash (see the module doc)."""
    out: list[str] = []
    _write(node, out)
    return "".join(out)


def node_fingerprint(node: ast.AST) -> str:
    """The fingerprint of a ``def``/``class`` node. ``node`` is not modified."""
    text = f"patchkit-fingerprint-{FORMAT}\n{canonical(node)}"
    return hashlib.sha256(text.encode()).hexdigest()[:LENGTH]


def nested_statements(body: Sequence[ast.stmt]) -> list[ast.stmt]:
    """Statements of ``body``, looking into ``if``/``try``/``with`` blocks that define names too."""
    found: list[ast.stmt] = []
    for statement in body:
        found.append(statement)
        if isinstance(statement, _BLOCKS):
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


def identity(path: str | os.PathLike[str]) -> tuple[str, int, int, int, int]:
    """What identifies one version of a file without reading it: path, size, mtime, ctime, inode.

    ctime and the inode are there because pip restores a wheel's mtimes: two releases built with a
    fixed ``SOURCE_DATE_EPOCH`` can give a file the same size and mtime, but rewriting a file always
    moves its ctime.
    """
    stat = os.stat(path)
    return str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


@functools.lru_cache(maxsize=64)
def _parsed(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def parse_file(path: str | os.PathLike[str]) -> ast.Module:
    """The syntax tree of a source file, cached until the file changes."""
    return _parsed(*identity(path))


@functools.lru_cache(maxsize=1024)
def _cached_file_fingerprint(file: tuple[str, int, int, int, int], qualname: tuple[str, ...]) -> str | None:
    node = locate(_parsed(*file), qualname)
    return None if node is None else node_fingerprint(node)


def file_fingerprint(path: str | os.PathLike[str], qualname: Sequence[str], persist: bool = False) -> str | None:
    """The fingerprint of ``qualname`` defined in the source file ``path``; None if it is not there.

    With ``persist``, the on-disk cache (:mod:`.fpcache`) is read first and written after, so the
    next process that asks about the same file version does not parse it.
    """
    if not persist:
        return _cached_file_fingerprint(identity(path), tuple(qualname))
    from . import fpcache

    # The key is the content's hash (read once per file version in this process); a value is only
    # ever computed from the bytes whose hash files it, so an entry describes exactly that content.
    dotted = ".".join(qualname)
    found = fpcache.lookup((_content_digest(*identity(path)), dotted))
    if found is fpcache.MISSING:
        source = Path(path).read_bytes()
        key = fpcache.key(source, dotted)
        found = _source_fingerprint_of(key[0], source, str(path), tuple(qualname))
        fpcache.store(key, found)
    return found if isinstance(found, str) else None


@functools.lru_cache(maxsize=256)
def _content_digest(path: str, size: int, mtime_ns: int, ctime_ns: int, inode: int) -> str:
    """The sha256 of a file's content, per file identity within this process (see ``fpcache.key``)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


_trees: dict[str, ast.Module] = {}  #: by content hash: a file parsed once for all its targets


def _source_fingerprint_of(digest: str, source: bytes, path: str, qualname: tuple[str, ...]) -> str | None:
    tree = _trees.get(digest)
    if tree is None:
        tree = ast.parse(source.decode("utf-8"), filename=path)
        if len(_trees) >= 64:
            _trees.clear()
        _trees[digest] = tree
    node = locate(tree, qualname)
    return None if node is None else node_fingerprint(node)


def source_fingerprint(source: str, qualname: Sequence[str]) -> str | None:
    """The fingerprint of ``qualname`` defined in module source text ``source``."""
    node = locate(ast.parse(source), qualname)
    return None if node is None else node_fingerprint(node)


def module_file(module: str) -> str | None:
    """The source file of ``module``: from the imported module if it is imported, else found on disk.

    A module not imported yet is looked up below its top-level package's folders without running any
    package ``__init__`` (reading a target's source must not import the upstream: Megatron-Bridge's
    ``__init__`` fails without TransformerEngine, yet its files are plain source); ``find_spec`` is the
    fallback for layouts the walk does not cover.
    """
    imported = sys.modules.get(module)
    origin = getattr(imported, "__file__", None) if imported is not None else None
    if origin is None:
        origin = _file_on_disk(module)
    if origin is None:
        try:
            spec = importlib.util.find_spec(module)
        except Exception:  # a parent package that fails to import: no readable source
            return None
        origin = spec.origin if spec is not None else None
    return origin if origin and origin.endswith(".py") and os.path.isfile(origin) else None


def _file_on_disk(module: str) -> str | None:
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level lookup imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return spec.origin
    for root in spec.submodule_search_locations or ():
        base = os.path.join(root, *rest.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
    return None


def target_fingerprint(target: Target, persist: bool = False) -> str | None:
    """The fingerprint of the code now installed at ``target``, or None if it has no readable source.

    The target is looked up where it is declared (its module's file, walking the qualname); a
    target defined elsewhere (an inherited method, a re-exported function) is found through the
    object's own ``__module__``/``__qualname__``.
    """
    path = module_file(target.module)
    if path is not None:
        found = file_fingerprint(path, target.path, persist)
        if found is not None:
            return found
    return _object_fingerprint(target, persist)


def _object_fingerprint(target: Target, persist: bool) -> str | None:
    obj: Any = sys.modules.get(target.module)
    for name in target.path:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    obj = getattr(obj, "__func__", obj)
    import inspect  # only for a target not found in its module's file: inspect costs ms to import

    if callable(obj):
        obj = inspect.unwrap(obj)
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        return None
    path = module_file(module)
    return None if path is None else file_fingerprint(path, qualname.split("."), persist)
