"""The stack a report is about, and what is wrong with it as a whole.

``patchkit status`` and ``patchkit doctor`` open with the versions that matter (Python, torch and its
CUDA, every upstream the catalogue patches), read from installed metadata without importing
anything heavy. They then import the upstreams one at a time, saying so on stderr, so that an
upstream that does not import is found once, as an environment problem with its likely cause
(an installed dependency outside what the upstream requires, ``pip check``-style) and a fix, instead
of as one failure per patch of that upstream.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, Mapping, Sequence

from .._version import DISTRIBUTION_NAME
from ..runtime import distinfo, pep440
from ..runtime.status import PatchStatus, State

#: A header entry for an upstream that is not installed.
NOT_INSTALLED = "not installed"
_CUDA_LINE = re.compile(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?$")


def cuda_version() -> str | None:
    """The CUDA version torch was built with (None: a CPU build, or no torch), without importing torch
    when it is not imported yet (its ``version.py`` is read as text)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return getattr(getattr(torch, "version", None), "cuda", None)
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        try:
            found = _CUDA_LINE.search((Path(folder) / "version.py").read_text(encoding="utf-8"))
        except OSError:
            continue
        if found:
            return None if found.group(1) == "None" else found.group(1)
    return None


def stack(distributions: Iterable[str]) -> dict[str, str | None]:
    """Python, torch, CUDA and each distribution's installed version (None: not installed)."""
    found: dict[str, str | None] = {"python": sys.version.split()[0], "torch": distinfo.version("torch")}
    found["cuda"] = cuda_version() if found["torch"] else None
    for dist in sorted(set(distributions) - {"torch"}):
        found[dist] = distinfo.version(dist)
    return found


def header(versions: Mapping[str, str | None], tool: str, width: int = 100) -> list[str]:
    """The stack as a few lines of at most ``width`` columns, e.g. ``stack: Python 3.12.3, torch ...``."""
    import patchkit

    torch = versions.get("torch")
    cuda = versions.get("cuda")
    parts = [f"{DISTRIBUTION_NAME} {patchkit.__version__}", f"Python {versions.get('python')}",
             f"torch {torch} ({f'CUDA {cuda}' if cuda else 'no CUDA'})" if torch else f"torch {NOT_INSTALLED}"]
    parts += [f"{dist} {version or NOT_INSTALLED}" for dist, version in versions.items()
              if dist not in ("python", "torch", "cuda")]
    lines, line = [], f"{tool}:"
    for part in parts:
        piece = f" {part}" + ("," if part is not parts[-1] else "")
        if len(line) + len(piece) > width:
            lines.append(line)
            line = " " * len(f"{tool}:")
        line += piece
    lines.append(line)
    return lines


@dataclass
class Conflict:
    """An installed distribution that another one's requirement excludes (what ``pip check`` reports)."""

    requirer: str
    requirer_version: str
    requirement: str  #: e.g. ``transformers<5,>=4.57``
    name: str
    installed: str | None

    def __str__(self) -> str:
        found = f"{self.installed} is installed" if self.installed else "it is not installed"
        return f"{self.requirer} {self.requirer_version} requires {self.requirement}, but {found}"


def conflicts(distributions: Iterable[str]) -> list[Conflict]:
    """The requirements of ``distributions`` that the installed packages do not meet. Requirements
    with an environment marker (extras, platforms) and those patchkit cannot parse are left out:
    what is reported is sure."""
    found = []
    for dist in sorted(set(distributions)):
        version = distinfo.version(dist)
        if version is None:
            continue
        try:
            requirements = importlib.metadata.requires(dist) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in requirements:
            match = _REQUIREMENT.match(text)
            if match is None or (match.group(3) or "").strip():
                continue
            name, specifier = match.group(1), match.group(2).strip()
            installed = distinfo.version(name)
            if installed is None:
                found.append(Conflict(dist, version, f"{name}{specifier}", name, None))
                continue
            if not specifier:
                continue
            try:
                ok = pep440.SpecifierSet(specifier).contains(installed)
            except (pep440.InvalidSpecifier, pep440.InvalidVersion):
                continue
            if not ok:
                found.append(Conflict(dist, version, f"{name}{specifier}", name, installed))
    return found


@dataclass
class Problem:
    """An upstream that does not import here: every patch of it is blocked until the stack is fixed."""

    distribution: str
    version: str | None
    module: str
    error: str
    conflicts: list[Conflict] = field(default_factory=list)

    @property
    def fix(self) -> str:
        if self.conflicts:
            wanted = " ".join(f"'{c.requirement}'" for c in self.conflicts)
            return f"pip install {wanted} (what {self.distribution} {self.version} requires), then `pip check`"
        missing = re.search(r"No module named '([^']+)'", self.error)
        if missing:
            return (f"install the module {missing.group(1)!r} that {self.distribution} imports, "
                    f"or reinstall {self.distribution}=={self.version}; then `pip check`")
        return f"reinstall {self.distribution}=={self.version} with its dependencies; then `pip check`"

    def lines(self) -> list[str]:
        return describe(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "version": self.version, "module": self.module,
                "error": self.error, "conflicts": [str(c) for c in self.conflicts], "fix": self.fix}


def describe(problem: Mapping[str, Any]) -> list[str]:
    """A problem (as :meth:`Problem.to_dict` gives it) for people: what, why, and the fix."""
    said = [f"environment problem: {problem['distribution']} {problem['version']} does not import "
            f"({problem['module']}: {problem['error']})"]
    said += [f"  conflict: {conflict}" for conflict in problem["conflicts"]]
    said.append(f"  fix: {problem['fix']}")
    return said


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@dataclass(frozen=True)
class OptionalDependency:
    """A module of an upstream that imports only with a package the upstream does not require, which
    is not installed here (vLLM's Ray executor without Ray): the patches of that module do not apply
    here, and the upstream itself is fine."""

    module: str
    missing: str


def import_upstreams(statuses: Sequence[PatchStatus], distribution_of: Mapping[str, str],
                     progress: IO[str] | None = None,
                     optional: dict[str, OptionalDependency] | None = None) -> list[Problem]:
    """Import what the pending patches wait for, one upstream at a time; the upstreams that fail.

    ``distribution_of`` maps a patch id to its upstream distribution. With ``progress``, each
    upstream is announced there before its import (``importing megatron-core ...``) and its time
    given after: importing torch-based upstreams takes seconds each. A module that fails only for a
    missing optional dependency (:func:`missing_optional`) is not the upstream's problem: it goes
    into ``optional`` (module name -> what is missing) and the upstream's other modules are imported.
    """
    modules: dict[str, list[str]] = {}
    for status in statuses:
        if status.state is State.PENDING and status.id in distribution_of:
            wanted = modules.setdefault(distribution_of[status.id], [])
            wanted += [m for m in status.waiting_for if m not in wanted]
    problems = []
    for dist, wanted in sorted(modules.items()):
        if all(module in sys.modules for module in wanted):
            continue
        if progress is not None:
            progress.write(f"importing {dist} ...")
            progress.flush()
        started = time.perf_counter()
        failed = None
        for module in wanted:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any failure to import is the environment's problem
                missing = missing_optional(exc, module, dist)
                if missing is not None:
                    if optional is not None:
                        optional[module] = OptionalDependency(module, missing)
                    continue
                failed = Problem(dist, distinfo.version(dist), module, _first_line(exc), conflicts([dist]))
                break
        if progress is not None:
            outcome = "does not import" if failed else "done"
            progress.write(f" {outcome} ({time.perf_counter() - started:.1f} s)\n")
            progress.flush()
        if failed is not None:
            problems.append(failed)
    return problems


def missing_optional(exc: BaseException, module: str, distribution: str) -> str | None:
    """The top-level package whose absence made ``module`` fail to import, when it is not installed
    and ``distribution`` does not require it (an optional dependency: Ray for vLLM); None otherwise.
    The package is the one the error names or, for another error, one ``module`` imports (guarded
    imports, as vLLM guards Ray's). A required dependency missing, a module of the upstream itself
    missing or an error in a module importing only what is installed is the upstream's problem."""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        named = [exc.name.split(".", 1)[0]]
    else:  # vLLM's ray_executor_v2 guards `from ray... import` and fails later, on a name (NameError)
        named = sorted(_imported_packages(module))
    required = _required(distribution)
    for top in named:
        if top == module.split(".", 1)[0] or _normalized(top) in required or top in sys.stdlib_module_names:
            continue
        try:
            installed = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            return top
    return None


def _imported_packages(module: str) -> set[str]:
    """The top-level packages ``module``'s source imports anywhere (guarded imports included)."""
    import ast

    try:
        spec = importlib.util.find_spec(module)
        source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
        tree = ast.parse(source)
    except (ImportError, ValueError, OSError, SyntaxError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".", 1)[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".", 1)[0])
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _required(distribution: str) -> set[str]:
    """The names ``distribution`` requires unconditionally (no extra, no marker), normalised."""
    try:
        requirements = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return set()
    found = set()
    for text in requirements:
        match = _REQUIREMENT.match(text)
        if match is not None and not (match.group(3) or "").strip():
            found.add(_normalized(match.group(1)))
    return found


def blocked_by(status: PatchStatus, distribution: str | None, problems: Sequence[Problem]) -> Problem | None:
    """The environment problem that made ``status`` fail (its upstream does not import), if any."""
    if status.state is not State.FAILED or distribution is None:
        return None
    return next((p for p in problems if p.distribution == distribution), None)


class _HoldBackBlocked(logging.Filter):
    """Drops the engine's "<patch>: importing <module> failed" errors for patches of an upstream
    already reported as an environment problem: said once there, not once per patch."""

    def __init__(self, blocked: set[str], distribution_of: Mapping[str, str]) -> None:
        super().__init__()
        self.blocked, self.distribution_of = blocked, distribution_of

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not ("importing %s failed" in str(record.msg) and args
                    and self.distribution_of.get(str(args[0])) in self.blocked)


@contextlib.contextmanager
def said_once(problems: Sequence[Problem], distribution_of: Mapping[str, str]) -> Iterator[None]:
    """For the block, hold back per-patch import errors of the upstreams in ``problems``."""
    if not problems:
        yield
        return
    own = logging.getLogger("patchkit")
    held = _HoldBackBlocked({p.distribution for p in problems}, distribution_of)
    own.addFilter(held)
    try:
        yield
    finally:
        own.removeFilter(held)
