"""Fingerprints: the same for the same code, whatever its docstrings, comments and layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from patchkit.matrix.artifacts import SourceTree
from patchkit.matrix.symbols import inspect_file
from patchkit.runtime import fingerprint
from patchkit.runtime.declaration import Target

from .conftest import SOURCE

BASE = '''
@decorate
def f(x, y=1):
    """Docstring."""
    # a comment
    return x + y
'''


def test_docstrings_comments_and_layout_do_not_count() -> None:
    restyled = '''
@decorate
def f(x,
      y=1):
    """Another docstring, much longer than the first one."""
    return (x +
            y)  # a comment
'''
    assert fingerprint.source_fingerprint(BASE, ["f"]) == fingerprint.source_fingerprint(restyled, ["f"])


def test_code_signature_and_decorators_count() -> None:
    base = fingerprint.source_fingerprint(BASE, ["f"])
    assert fingerprint.source_fingerprint(BASE.replace("x + y", "x - y"), ["f"]) != base
    assert fingerprint.source_fingerprint(BASE.replace("y=1", "y=2"), ["f"]) != base
    assert fingerprint.source_fingerprint(BASE.replace("@decorate\n", ""), ["f"]) != base


def test_a_missing_symbol_has_no_fingerprint() -> None:
    assert fingerprint.source_fingerprint(BASE, ["g"]) is None
    assert fingerprint.source_fingerprint(SOURCE, ["Model", "sideways"]) is None


def test_installed_module_and_artifact_file_agree(make_dist, tmp_path: Path) -> None:
    dist = make_dist()
    installed = fingerprint.target_fingerprint(Target.parse(dist.target("Model.forward")))
    artifact = tmp_path / "artifact" / "src"
    shutil.copytree(dist.root / dist.package, artifact / dist.package)
    tree = SourceTree(dist.name, dist.version, artifact, "copy")
    from_artifact = inspect_file(tree.module_file(dist.core), ["Model", "forward"])
    assert installed is not None and installed == from_artifact.fingerprint
    assert installed == fingerprint.source_fingerprint(SOURCE, ["Model", "forward"])


def test_an_inherited_target_is_fingerprinted_where_it_is_defined(make_dist) -> None:
    dist = make_dist()
    __import__(dist.core)
    inherited = fingerprint.target_fingerprint(Target.parse(dist.target("Child.forward")))
    assert inherited == fingerprint.target_fingerprint(Target.parse(dist.target("Model.forward")))


def test_parsed_files_are_cached_until_they_change(make_dist) -> None:
    dist = make_dist()
    path = dist.root / dist.package / "core.py"
    fingerprint.file_fingerprint(path, ["Model", "forward"])
    before = fingerprint._parsed.cache_info()
    first = fingerprint.file_fingerprint(path, ["Model", "backward"])
    assert fingerprint._parsed.cache_info().hits == before.hits + 1
    path.write_text(path.read_text().replace("return x - 1", "return x - 2  # changed"))
    assert fingerprint.file_fingerprint(path, ["Model", "backward"]) != first


# -- the same fingerprints on every Python ----------------------------------------------------------

EVERY_SYNTAX = '''
import os
from typing import Any


@decorator(arg=1)
class Widget(Base, metaclass=Meta, flag=True):
    """Docstring."""
    size: int = 3
    label = u"unicode prefix" "implicit" 'concat'

    def method(self, a, /, b: int = 2, *args: Any, c, d=None, **kw) -> "Widget":
        x = [i * 2 for i in range(10) if i % 2] + list({k: v for k, v in kw.items()}) + [*args]
        y = {a, b} | {z async_free for z in ()} if False else (lambda q, *, r=1: q + r)(1)
        s = f"{a!r:>{b}} {c=} {d:.3f} {{literal}} {'nested'} {x[1:2:3]}" f"tail{a}" "plain"
        t = rb"raw\\bytes" + b"\\x00" ; u = 1_000 + 0x1F + 0o17 + 0b11 + 1.5e-3 + 2j + ...
        if (n := len(x)) > 3 and not a or b is not None:
            del x[0]
        elif a < b <= c != d:
            assert a, "message"
        else:
            raise ValueError("bad") from None
        for i, (j, k) in enumerate(zip(x, x)):
            continue
        else:
            pass
        while False:
            break
        try:
            import json as j2
        except (ImportError, OSError) as exc:
            raise
        except Exception:
            pass
        else:
            j2 = None
        finally:
            x = ~a ** -b // c @ d >> 1 << 2 & 3 ^ 4
        with open(os.devnull) as f, open(os.devnull) as g:
            global G
            G = f, g
        match kw:
            case {"k": [1, 2, *rest]} | {"j": str() as s2} if rest:
                pass
            case Point(x=0, y=_) | None:
                pass
            case _:
                pass
        return self

    @staticmethod
    async def coroutine(*items):
        async with ctx() as c:
            async for item in c:
                await item
        yield from ()

    def generator(self):
        nonlocal_free = 1

        def inner():
            nonlocal nonlocal_free
            nonlocal_free += 1
            return (yield nonlocal_free)
        return inner
'''.replace("{z async_free for z in ()}", "{z for z in ()}")

TRY_STAR = '''
def grouped():
    try:
        pass
    except* ValueError as group:
        raise
'''

PEP_695 = '''
type Alias[T] = list[T]

class Box[T: int, *Ts, **P]:
    def get[U](self, value: U) -> T | U:
        return value

def plain(x):
    return x
'''

SCRIPT = '''
import ast, json, sys
from patchkit.runtime import fingerprint as f

out = {}
for label, path in json.loads(sys.argv[1]).items():
    text = open(path, encoding="utf-8").read()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        continue
    for node in ast.walk(tree):
        if isinstance(node, f._DEFINITIONS):
            out[f"{label}:{node.lineno}:{node.name}"] = f.node_fingerprint(node)
print(json.dumps(out, sort_keys=True))
'''


def _interpreters() -> dict[str, str]:
    """One interpreter per Python 3.10-3.13 found here (pyenv, PATH): version -> path."""
    import glob
    import os
    import subprocess

    found: dict[str, str] = {}
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates = sorted(glob.glob(f"{root}/versions/3.1[0-3].*/bin/python3"))
    candidates += [f"python3.{minor}" for minor in range(10, 14)]
    for candidate in candidates:
        try:
            version = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                     capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if version:
            found.setdefault(version, candidate)
    return found


def _megatron_files() -> dict[str, str]:
    """Real megatron-core files: from the installed wheel, else from the artifact cache, else none."""
    from importlib import metadata

    from patchkit.matrix.artifacts import DEFAULT_CACHE

    wanted = ["megatron/core/models/gpt/gpt_model.py", "megatron/core/transformer/moe/router.py",
              "megatron/core/transformer/moe/token_dispatcher.py",
              "megatron/core/transformer/multi_token_prediction.py"]
    try:
        dist = metadata.distribution("megatron-core")
        found = {f"installed-{w}": str(dist.locate_file(w)) for w in wanted}
    except metadata.PackageNotFoundError:
        found = {f"artifact-{w}": str(p) for w in wanted
                 for p in sorted(DEFAULT_CACHE.glob(f"megatron-core/*/src/{w}"))[-1:]}
    return {k: v for k, v in found.items() if Path(v).is_file()}


def test_fingerprints_are_the_same_on_every_python(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    pythons = _interpreters()
    required = {"3.11", "3.12"}
    if not required <= set(pythons):
        pytest.skip(f"needs Python {', '.join(sorted(required))} here, found {sorted(pythons)}")
    sources = {"every_syntax": EVERY_SYNTAX, "try_star": TRY_STAR, "pep695": PEP_695}
    files = {label: str(tmp_path / f"{label}.py") for label in sources}
    for label, text in sources.items():
        Path(files[label]).write_text(text)
    files.update(_megatron_files())
    root = str(Path(__file__).resolve().parents[2])
    results = {}
    for version, python in sorted(pythons.items()):
        run = subprocess.run([python, "-I", "-c", f"import sys; sys.path.insert(0, {root!r})\n{SCRIPT}",
                              json.dumps(files)], capture_output=True, text=True, timeout=600,
                             env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert run.returncode == 0, run.stderr
        results[version] = json.loads(run.stdout)
    baseline = results["3.12"]
    assert any(k.startswith("every_syntax:") for k in baseline) and any(k.startswith("pep695:") for k in baseline)
    for version, found in results.items():
        shared = set(found) & set(baseline)  # 3.10 cannot parse except*, 3.10/3.11 not PEP 695
        assert shared and {k: found[k] for k in shared} == {k: baseline[k] for k in shared}, version
        assert len(found) >= len([k for k in baseline if k.startswith(("every_syntax", "installed", "artifact"))])


def test_a_new_interpreter_field_that_is_empty_does_not_count() -> None:
    import ast

    node = ast.parse("def f(x):\n    return x\n").body[0]
    before = fingerprint.node_fingerprint(node)
    node.type_params = []  # what 3.12 adds to every def
    node.future_field = None  # what a later Python might add
    node._fields = (*node._fields, "future_field")
    assert fingerprint.node_fingerprint(node) == before


def test_f_string_parts_are_compared_merged() -> None:
    import ast

    split = ast.JoinedStr([ast.Constant("a"), ast.Constant(""), ast.Constant("b"),
                           ast.FormattedValue(ast.Name("x", ast.Load()), -1, None)])
    merged = ast.JoinedStr([ast.Constant("ab"), ast.FormattedValue(ast.Name("x", ast.Load()), -1, None)])
    assert fingerprint.canonical(split) == fingerprint.canonical(merged)


def test_the_disk_cache_spares_the_parse_and_survives_corruption(make_dist, tmp_path, monkeypatch) -> None:
    from patchkit.runtime import fpcache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fpcache.clear()
    dist = make_dist()
    path = dist.root / dist.package / "core.py"
    first = fingerprint.file_fingerprint(path, ["Model", "forward"], persist=True)
    fpcache.flush()
    assert Path(fpcache.path()).is_file()
    fpcache.clear()
    fingerprint._parsed.cache_clear()
    fingerprint._cached_file_fingerprint.cache_clear()
    fingerprint._trees.clear()
    assert fingerprint.file_fingerprint(path, ["Model", "forward"], persist=True) == first
    assert fingerprint._parsed.cache_info().misses == 0 and not fingerprint._trees  # answered from disk
    Path(fpcache.path()).write_bytes(b"\x00garbage")
    fpcache.clear()
    assert fingerprint.file_fingerprint(path, ["Model", "forward"], persist=True) == first
    path.write_text(path.read_text().replace("return x + 1", "return x + 3"))
    assert fingerprint.file_fingerprint(path, ["Model", "forward"], persist=True) != first
    fpcache.clear()
