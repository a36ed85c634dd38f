"""Fingerprints: the same for the same code, whatever its docstrings, comments and layout."""

from __future__ import annotations

import shutil
from pathlib import Path

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
