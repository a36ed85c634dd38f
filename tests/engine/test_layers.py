"""The layers of patchkit, read from the source: which module may import which (docs/architecture.md).

Every import counts, wherever it stands: at the top, inside a function (a lazy import is still a
dependency, paid the first time that path runs), under ``TYPE_CHECKING``. Relative imports are
resolved; ``from package import name`` counts as importing the module ``package.name`` where one
exists, else ``package`` itself.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "patchkit"
TOOLING = ("patchkit.matrix", "patchkit.doctor", "patchkit.cli", "patchkit.report", "patchkit.upstream_output",
           "patchkit.__main__")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    if not name.startswith("patchkit.") and name != "patchkit":
        return False
    relative = PACKAGE.parent.joinpath(*name.split("."))
    return relative.with_suffix(".py").is_file() or (relative / "__init__.py").is_file()


def imports(path: Path, name: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import in ``path``, read as module ``name`` (by
    default, the module the path is in the package)."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                child = f"{base}.{alias.name}"
                yield node.lineno, child if _is_module(child) else base


def _modules(*names: str) -> list[Path]:
    found = []
    for name in names:
        path = PACKAGE.parent.joinpath(*name.split("."))
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")])
    return found


#: What every process loads: ``import patchkit`` (the package's __init__) and the runtime.
START_UP = [PACKAGE / "__init__.py", PACKAGE / "_version.py", *_modules("patchkit.runtime")]


def _stdlib(name: str) -> bool:
    return name.partition(".")[0] in sys.stdlib_module_names


@pytest.mark.parametrize("path", START_UP, ids=lambda p: _module_name(p))
def test_the_runtime_imports_only_itself_and_the_standard_library(path: Path) -> None:
    # No tooling (matrix, doctor, CLI, report), no processes code, no third-party package.
    wrong = [f"line {line}: {module}" for line, module in imports(path)
             if not (_stdlib(module) or module.startswith("patchkit.runtime") or module == "patchkit._version"
                     or (path.name == "__init__.py" and path.parent == PACKAGE and module == "patchkit.runtime"))]
    assert not wrong, f"{_module_name(path)} imports outside the runtime: {wrong}"


@pytest.mark.parametrize("path", [*_modules("patchkit.processes"), PACKAGE / "selfcheck.py"],
                         ids=lambda p: _module_name(p))
def test_processes_and_selfcheck_import_neither_tooling_nor_the_top_level_package(path: Path) -> None:
    # The top-level package is the public facade over the runtime: a module beneath it that reaches
    # back up makes an import cycle (patchkit -> ... -> patchkit).
    wrong = [f"line {line}: {module}" for line, module in imports(path)
             if module == "patchkit" or module.startswith(TOOLING)]
    assert not wrong, f"{_module_name(path)} imports: {wrong}"


def test_the_import_scanner_sees_lazy_relative_and_from_imports(tmp_path: Path) -> None:
    # The scanner itself must be able to fail: a lazy tooling import in a function is found.
    probe = tmp_path / "probe.py"
    probe.write_text("import os.path\nif TYPE_CHECKING:\n    from ..matrix.model import Matrix\n"
                     "def f():\n    from ..matrix import loader\n    from .. import engine\n    from . import drift\n")
    assert sorted(imports(probe, "patchkit.runtime.probe")) == [
        (1, "os.path"), (3, "patchkit.matrix.model"), (5, "patchkit.matrix.loader"), (6, "patchkit"),
        (7, "patchkit.runtime.drift")]


def test_apply_all_with_extra_patches_loads_only_the_runtime(tmp_path: Path) -> None:
    # PATCHKIT_EXTRA_PATCHES used to pull patchkit.processes.autoload, and with it dataclasses,
    # inspect, ast and dis, into every process's start-up.
    (tmp_path / "extra_decl.py").write_text("PATCHES = ()\n")
    code = ("import sys, patchkit; patchkit.apply_all(); "
            "print(sorted(m for m in sys.modules if m in ('inspect', 'ast', 'dis', 'dataclasses') "
            "or m.startswith(('patchkit.processes', 'patchkit.matrix', 'patchkit.doctor', 'patchkit.cli'))))")
    env = {**os.environ, "PATCHKIT_EXTRA_PATCHES": "extra_decl", "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("PATCHKIT_AUTOLOAD", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


#: The runtime's machinery that acts on a decision: keeps the registry, imports, installs, hears of
#: imports and forks (docs/architecture.md, "Inside the runtime").
ACTING = ("patchkit.runtime.engine", "patchkit.runtime.entries", "patchkit.runtime.jobs", "patchkit.runtime.installer",
          "patchkit.runtime.import_watch", "patchkit.runtime.hooks", "patchkit.runtime.forking",
          "patchkit.runtime.interrupts", "patchkit.runtime.process_engine")


@pytest.mark.parametrize("name", ["patchkit.runtime.decision", "patchkit.runtime.gating"])
def test_the_decision_imports_none_of_the_machinery_that_acts_on_it(name: str) -> None:
    # The decision is pure: table-tested from facts alone (tests/engine/test_decisions.py).
    wrong = [f"line {line}: {module}" for line, module in imports(*_modules(name)) if module in ACTING]
    assert not wrong, f"{name} imports: {wrong}"


@pytest.mark.parametrize("name", ["patchkit.runtime.import_watch", "patchkit.runtime.forking",
                                  "patchkit.runtime.hooks"])
def test_import_dispatch_and_fork_handling_know_no_engine(name: str) -> None:
    # They reach engines through what each one registered (import_watch.listen, forking.guard): the
    # engine depends on them, never the other way round.
    engine_side = ("patchkit.runtime.engine", "patchkit.runtime.entries", "patchkit.runtime.jobs",
                   "patchkit.runtime.process_engine")
    wrong = [f"line {line}: {module}" for line, module in imports(*_modules(name)) if module in engine_side]
    assert not wrong, f"{name} imports: {wrong}"


def test_apply_all_that_installs_nothing_loads_neither_the_installer_nor_the_drift_check() -> None:
    # Start-up with the upstreams installed but not imported: every patch waits or is skipped.
    code = ("import sys, patchkit; patchkit.apply_all(); print(sorted(m for m in sys.modules if m in "
            "('patchkit.runtime.installer', 'patchkit.runtime.drift', 'patchkit.runtime.fpcache', "
            "'patchkit.runtime.fingerprint', 'patchkit.runtime._recorded')))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PACKAGE.parent), os.environ.get("PYTHONPATH", "")])}
    env.pop("PATCHKIT_AUTOLOAD", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
