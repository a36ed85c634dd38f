"""Comparing installed upstream code with the fingerprints the compatibility matrix recorded.

Two questions, both answered from fingerprints (:mod:`patchkit.runtime.fingerprint`) of each
``Replace``/``Wrap`` target as installed now:

* **drift** (:func:`check`), when a variant is about to install on a version its range holds: a
  target matching none of the fingerprints recorded for that variant on the versions in its range
  is drifted. A target with no recorded fingerprint, or without readable source, is unknown, never
  drifted; so is a release recorded without fingerprints (its tests ran where the targets could
  not be read).
* **code identity** (:func:`identity`), for a release beyond every variant's range: if every target
  of the nearest variant has a fingerprint equal to one recorded for that variant, the code the
  patch replaces is byte-for-byte (modulo docstrings, comments, layout) code it was verified on.

Where the records come from: plain data, never YAML. By default ``patchkit/runtime/_recorded.py``, a
data module the matrix tooling generates from ``compat_matrix.yaml`` (``patchkit matrix check`` keeps
the two in step). An engine may be given other records (:data:`RecordSource`): the records
themselves, or a function returning them, called on first use; for another matrix file,
``patchkit.matrix.index.source(path)`` is that function. The caller passes data, so this module
imports no tooling.

Costs: fingerprints go through the on-disk cache (:mod:`.fpcache`), so a process parses an upstream
file only the first time that version of the file is seen on the machine.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Union, cast

from . import distinfo, pep440, records
from .declaration import Replace, Target, Variant, Wrap
from .errors import DeclarationError
from .versions import specifier  # parsed once per process: every install checks its variant's ranges

#: versions (sorted (dist, version) pairs), status, sorted (target, fingerprint or None) pairs
Record = tuple[tuple[tuple[str, str], ...], str, tuple[tuple[str, "str | None"], ...]]
#: patch id -> variant name -> its records: what ``_recorded.RECORDS`` holds.
Index = Mapping[str, Mapping[str, tuple[Record, ...]]]

#: Where the engine reads fingerprints from: None for the records shipped with patchkit, an
#: :data:`Index`, or a function given ``strict`` that returns one (None: no records, drift unknown)
#: or raises a typed error, which strict mode lets through.
RecordSource = Union[Index, Callable[[bool], "Index | None"], None]

VERIFIED = "verified"


class Drift(records.Record):
    """Targets whose installed code matches no fingerprint recorded for the variant's range."""

    patch_id: str
    variant: str
    targets: tuple[str, ...]
    #: The upstream versions whose recorded fingerprints the targets were compared with.
    compared: tuple[str, ...]

    @property
    def detail(self) -> str:
        return (f"drifted: the installed code of {', '.join(self.targets)} differs from its fingerprint recorded "
                f"for variant {self.variant} on {'; '.join(self.compared)}; check that the patch still fits, then "
                f"run its tests and `patchkit matrix record`")


class Identity(records.Record):
    """The outcome of comparing a variant's targets with its records, for a release beyond its range."""

    identical: bool
    #: For identical: the recorded versions each target matched; otherwise what stopped it, per target.
    detail: str


def _index(source: RecordSource, strict: bool) -> Index | None:
    if source is None:
        from ._recorded import RECORDS

        return cast(Index, RECORDS)
    if callable(source):
        return source(strict)
    return source


def _installed_versions(variant: Variant) -> dict[str, str]:
    """The installed version of each distribution the variant requires, as metadata spells it."""
    found = {}
    for dist in variant.requires:
        version = distinfo.version(dist)
        if version is not None:
            found[dist] = version
    return found


def _in_range(variant: Variant, versions: Mapping[str, str]) -> bool:
    try:
        return all(dist in versions and specifier(spec).contains(versions[dist])
                   for dist, spec in variant.requires.items())
    except (pep440.InvalidVersion, pep440.InvalidSpecifier, DeclarationError):
        return False


def _shown(versions: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{dist} {version}" for dist, version in sorted(versions))


def _fingerprinted(variant: Variant) -> list[str]:
    return [action.target for action in variant.installs if isinstance(action, (Replace, Wrap))]


def _current(target: str) -> str | None:
    from .fingerprint import target_fingerprint

    return target_fingerprint(Target.parse(target), persist=True)


def check(patch_id: str, variant: Variant, source: RecordSource = None, strict: bool = False) -> Drift | None:
    """Compare ``variant``'s targets, as installed now, with the records. None: not drifted or unknown."""
    index = _index(source, strict)
    if index is None:
        return None
    every_record = index.get(patch_id, {}).get(variant.name, ())
    records = [r for r in every_record if r[1] == VERIFIED and r[2] and _in_range(variant, dict(r[0]))]
    if not records:
        return None
    # The installed release itself recorded without a fingerprint (its tests ran where the target
    # could not be read): nothing to compare it with, so unknown, never drift against another release.
    installed = _installed_versions(variant)
    own_records = [r for r in every_record if dict(r[0]) == installed]
    drifted: list[str] = []
    compared: list[str] = []
    try:
        for target in _fingerprinted(variant):
            recorded = {fp: versions for versions, _, targets in records for t, fp in targets if t == target and fp}
            if not recorded:
                continue
            if own_records and not any(t == target and fp for r in own_records for t, fp in r[2]):
                continue
            current = _current(target)
            if current is None or current in recorded:
                continue
            drifted.append(target)
            for versions in recorded.values():
                if _shown(versions) not in compared:
                    compared.append(_shown(versions))
    finally:
        from . import fpcache

        fpcache.flush()
    if not drifted:
        return None
    return Drift(patch_id, variant.name, tuple(drifted), tuple(compared))


def _recorded_per_target(index: Index, patch_id: str, variant: Variant) -> dict[str, dict[str, Any]]:
    """target -> {fingerprint: versions} over the variant's verified records."""
    found: dict[str, dict[str, Any]] = {target: {} for target in _fingerprinted(variant)}
    for versions, status, pairs in index.get(patch_id, {}).get(variant.name, ()):
        if status != VERIFIED:
            continue
        for target, fp in pairs:
            if target in found and fp:
                found[target].setdefault(fp, versions)
    return found


def recorded_fingerprints(patch_id: str, variant: Variant, source: RecordSource = None) -> dict[str, frozenset[str]]:
    """target -> the fingerprints recorded for it on the variant's verified releases (empty: none recorded).

    What :func:`check` and :func:`identity` compare with, for reports (``patchkit doctor``). Reads the
    generated index by default: no YAML is parsed.
    """
    index = _index(source, strict=False)
    if index is None:
        return {}
    return {target: frozenset(fps) for target, fps in _recorded_per_target(index, patch_id, variant).items()}


def current_fingerprint(target: str) -> str | None:
    """The installed code's fingerprint of ``target`` (its module imported), through the on-disk cache."""
    try:
        return _current(target)
    finally:
        from . import fpcache

        fpcache.flush()


def identity_blocker(patch_id: str, variant: Variant, source: RecordSource = None, strict: bool = False) -> str | None:
    """Why code identity cannot hold whatever is installed (no records, or a target without one), or
    None if it is worth reading the installed code. Needs no upstream module."""
    index = _index(source, strict)
    if index is None:
        return "no compatibility records to compare the installed code with"
    recorded = _recorded_per_target(index, patch_id, variant)
    if not recorded:
        return f"variant {variant.name} has no fingerprinted target to compare"
    for target, fingerprints in recorded.items():
        if not fingerprints:
            return f"{target}: no fingerprint recorded for variant {variant.name}"
    return None


def identity(patch_id: str, variant: Variant, source: RecordSource = None, strict: bool = False) -> Identity:
    """Whether every target of ``variant``, as installed now (its modules imported), has a fingerprint
    recorded for it on a version the variant was verified on. For a release beyond every range."""
    blocker = identity_blocker(patch_id, variant, source, strict)
    if blocker is not None:
        return Identity(False, blocker)
    index = _index(source, strict)
    assert index is not None
    matched: list[str] = []
    try:
        for target, recorded in _recorded_per_target(index, patch_id, variant).items():
            current = _current(target)
            if current is None:
                return Identity(False, f"{target}: the installed code has no readable source")
            if current not in recorded:
                return Identity(False, f"{target} differs from every fingerprint recorded for variant "
                                       f"{variant.name} ({_shown_all(recorded.values())})")
            matched.append(f"{target} as on {_shown(recorded[current])}")
    finally:
        from . import fpcache

        fpcache.flush()
    return Identity(True, "; ".join(matched))


def _shown_all(versions: Iterable[Any]) -> str:
    return "; ".join(sorted({_shown(v) for v in versions}))
