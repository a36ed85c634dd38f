"""The constraints files that make every nox environment install the same packages next month.

Each nox session that installs packages has ``constraints/<session>.txt``: what ``uv pip compile``
resolved for its requirements on its Python (Linux x86-64), every package pinned with its hashes,
which uv verifies at install time. The upstreams under test stay pinned by ``compat_matrix.yaml``;
the lock pins everything they pull in (transformers, numpy, triton, pytest, ...).

The first line records a digest of the inputs (Python, requirements, override files), so an edit
to the matrix without ``nox -s lock`` is caught before anything installs (``stale``).

``torch`` keeps its pin but not its hashes: on Python 3.11 the environments install torch's CPU
build where a machine offers it locally (``2.13.0+cpu``, which ``==2.13.0`` admits), and that file's
hash is not the PyPI wheel's. Standard library only: ``noxfile.py`` imports it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: What every environment installs beside its upstreams (``-e .`` brings patchkit's own dependencies).
SELF_REQUIREMENTS = ("packaging>=23", "PyYAML>=6", "pytest", "pytest-xdist")
#: Distributions whose hashes a lock leaves out (see the module docstring).
UNHASHED = frozenset({"torch"})
_DIGEST_LINE = re.compile(r"^# inputs sha256:([0-9a-f]{64})$")


class StaleLockError(Exception):
    """A constraints file is missing or was made from other inputs than the session has now."""


@dataclass(frozen=True)
class LockInputs:
    """What one session's lock is resolved from."""

    python: str
    requirements: tuple[str, ...]
    #: Packages installed with ``--no-deps``, and direct references: pinned as they are, not resolved.
    unresolved: tuple[str, ...] = ()
    #: Paths (relative to the repository) of ``--override`` files passed to uv.
    overrides: tuple[str, ...] = ()
    override_texts: tuple[str, ...] = field(default=(), compare=False)

    def digest(self) -> str:
        content = {"python": self.python, "requirements": list(self.requirements),
                   "unresolved": list(self.unresolved), "overrides": list(self.override_texts)}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def inputs_for(python: str, steps: Sequence[Sequence[str]], root: Path,
               extra: Sequence[str] = SELF_REQUIREMENTS) -> LockInputs:
    """The lock inputs of a session that runs ``uv pip install`` once per step, then ``extra``."""
    requirements: list[str] = []
    unresolved: list[str] = []
    overrides: list[str] = []
    for step in steps:
        words = list(step)
        no_deps = "--no-deps" in words
        index = 0
        while index < len(words):
            word = words[index]
            if word == "--override":
                overrides.append(words[index + 1])
                index += 2
                continue
            if not word.startswith("-"):
                # A direct reference (`pkg @ git+...@<commit>`) is its own pin; resolving it would need
                # the network at lock time (and GitHub, which CI machines may not reach).
                (unresolved if no_deps or " @ " in word else requirements).append(word)
            index += 1
    requirements.extend(extra)
    texts = tuple((root / path).read_text() for path in overrides)
    return LockInputs(python, tuple(dict.fromkeys(requirements)), tuple(unresolved), tuple(overrides), texts)


def check(lock: Path, inputs: LockInputs, session: str) -> None:
    """Raise ``StaleLockError`` unless ``lock`` exists and was made from ``inputs``."""
    fix = "run `python3 -m nox -s lock -- " + session + "` and commit the file"
    try:
        with lock.open("rb") as stream:
            first = stream.readline().decode("ascii").rstrip("\r\n")
    except FileNotFoundError:
        raise StaleLockError(f"{lock} is missing: {fix}") from None
    except IsADirectoryError:
        raise StaleLockError(f"{lock} is a directory, not a constraints file: remove it, then {fix}") from None
    except UnicodeDecodeError:
        raise StaleLockError(f"{lock} does not start with the digest line `# inputs sha256:...` (its first "
                             f"line is not text): {fix}") from None
    except OSError as exc:
        raise StaleLockError(f"{lock} cannot be read ({exc.strerror or exc}): {fix}") from None
    match = _DIGEST_LINE.match(first)
    if match is None or match[1] != inputs.digest():
        raise StaleLockError(f"{lock} was made from other requirements than session {session} has now: {fix}")


def render(session: str, inputs: LockInputs, compiled: str) -> str:
    """The committed file: the digest line, a note, uv's resolution (torch unhashed), the --no-deps pins."""
    lines = [f"# inputs sha256:{inputs.digest()}",
             f"# Constraints for nox session {session} (Python {inputs.python}, Linux x86-64), made by "
             f"`python3 -m nox -s lock`; do not edit by hand.",
             *_drop_hashes(compiled.strip("\n").splitlines(), UNHASHED)]
    if inputs.unresolved:
        lines.append("# pinned by compat_matrix.yaml, not resolved (installed with --no-deps, or a direct reference):")
        lines.extend(inputs.unresolved)
    return "\n".join(lines) + "\n"


def _drop_hashes(lines: list[str], names: frozenset[str]) -> list[str]:
    kept: list[str] = []
    dropping = False
    for line in lines:
        if not line.startswith((" ", "\t")):
            name = re.split(r"[=<>!~ ;\[@]", line, maxsplit=1)[0].strip().lower()
            dropping = name in names
            kept.append(line.rstrip(" \\") if dropping else line)
        elif not (dropping and line.strip().startswith("--hash")):
            kept.append(line)
    return kept
