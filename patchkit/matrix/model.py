"""The contents of ``compat_matrix.yaml`` as plain data. See docs/compat-matrix.md for the schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

#: What a version record says about a variant on those upstream versions.
VERIFIED = "verified"  #: the variant's tests passed there
NATIVE = "native"  #: upstream has the behaviour there; the variant installs nothing
UNSUPPORTED = "unsupported"  #: the variant does not apply there (outside its range on purpose)
KNOWN_BAD = "known-bad"  #: tried there and found broken; the range must exclude it
STATUSES = (VERIFIED, NATIVE, UNSUPPORTED, KNOWN_BAD)
#: Statuses whose versions a variant's declared range must cover.
IN_RANGE = (VERIFIED, NATIVE)


@dataclass(frozen=True)
class Position:
    """Where something is in the matrix file (1-based line and column)."""

    path: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


@dataclass(frozen=True)
class TargetRecord:
    """One target's code on one upstream release: the fingerprint and the signature seen there."""

    fingerprint: str | None = None
    signature: str | None = None


@dataclass(frozen=True)
class VersionRecord:
    """One upstream version combination a variant was checked on, and what was found."""

    versions: Mapping[str, str]
    status: str
    verified_by: tuple[str, ...] = ()
    targets: Mapping[str, TargetRecord] = field(default_factory=dict)
    note: str = ""
    position: Position | None = field(default=None, compare=False)

    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.versions.items()))


#: The Python an environment runs on when it names none.
DEFAULT_PYTHON = "3.11"


@dataclass(frozen=True)
class Environment:
    """A test environment: pip install steps, the tests to run, whether CI runs it."""

    name: str
    tests: tuple[str, ...]
    install: tuple[tuple[str, ...], ...] = ()
    uninstall: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    ci: bool = False
    description: str = ""
    #: The interpreter the environment runs on ("3.11", "3.12"): what the upstream requires.
    python: str = DEFAULT_PYTHON
    position: Position | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Matrix:
    """The whole file. ``patches[patch_id][variant_name]`` lists that variant's version records."""

    path: Path | None
    schema: int
    environments: Mapping[str, Environment]
    patches: Mapping[str, Mapping[str, tuple[VersionRecord, ...]]]
    positions: Mapping[str, Position] = field(default_factory=dict, compare=False)

    def records(self, patch_id: str, variant: str) -> tuple[VersionRecord, ...]:
        return tuple(self.patches.get(patch_id, {}).get(variant, ()))
