"""``patchkit matrix check``: the registry of patches and the matrix agree.

* every variant of every registered patch has version records;
* every record belongs to a registered patch and one of its variants;
* a variant's declared range covers its ``verified``/``native`` versions, and excludes its
  ``unsupported``/``known-bad`` ones; recorded targets are targets the variant declares; a
  ``tests:<env>`` source names an environment of the matrix;
* the variants of one patch do not overlap (no version set selects two of them).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..runtime.catalogue import Registered
from ..runtime.declaration import Patch, Variant
from .model import IN_RANGE, Matrix, Position, VersionRecord


@dataclass(frozen=True)
class Disagreement:
    position: Position | None
    message: str

    def __str__(self) -> str:
        return f"{self.position}: {self.message}" if self.position else self.message


@functools.lru_cache(maxsize=1024)
def _specifier(spec: str) -> SpecifierSet:
    """Parsed once: a matrix of many records asks the same few ranges again and again."""
    return SpecifierSet(spec)


def _contains(spec: str, version: str) -> bool:
    return _specifier(spec).contains(Version(version), prereleases=True)


def covers(variant: Variant, versions: Mapping[str, str]) -> bool:
    """Whether ``versions`` select ``variant`` (every required distribution present and in range)."""
    return all(dist in versions and _contains(spec, versions[dist]) for dist, spec in variant.requires.items())


def _probes(specs: Iterable[str], extra: Iterable[str]) -> list[Version]:
    """Versions at and just past every bound: where two ranges can first meet."""
    found = {Version("0"), Version("99999")} | {Version(v) for v in extra}
    for spec in specs:
        for clause in SpecifierSet(spec):
            bound = clause.version.replace(".*", "")
            base = Version(bound)
            found |= {base, Version(f"{base.base_version}.post1"), Version(f"{base.base_version}.0.0.1")}
            release = list(base.release) + [0] * (3 - len(base.release))
            found.add(Version(".".join(map(str, release[:-1] + [release[-1] + 1]))))
    return sorted(found)


def overlap(first: Variant, second: Variant, recorded: Iterable[Mapping[str, str]] = ()) -> dict[str, Version] | None:
    """A version set that selects both variants, or None. Probed at the ranges' bounds."""
    witness: dict[str, Version] = {}
    for dist in sorted(set(first.requires) | set(second.requires)):
        specs = [v.requires[dist] for v in (first, second) if dist in v.requires]
        extra = [r[dist] for r in recorded if dist in r]
        sets = [_specifier(s) for s in specs]
        first_in_both = next((p for p in _probes(specs, extra) if all(s.contains(p, prereleases=True) for s in sets)),
                             None)
        if first_in_both is None:
            return None
        witness[dist] = first_in_both
    return witness


def check(matrix: Matrix, patches: Sequence[Registered]) -> list[Disagreement]:
    """Every disagreement between ``patches`` and ``matrix``; empty when they agree."""
    problems: list[Disagreement] = []
    registered: dict[str, Patch] = {r.patch.id: r.patch for r in patches}
    where = matrix.positions.get("patches")
    for patch_id, patch in registered.items():
        for variant in patch.variants:
            if not matrix.records(patch_id, variant.name):
                problems.append(Disagreement(where, f"{patch_id}: variant {variant.name!r} has no version records; run "
                                             f"its tests and `patchkit matrix record --env <environment>`"))
        records = [r.versions for records in matrix.patches.get(patch_id, {}).values() for r in records]
        for first, second in itertools.combinations(patch.variants, 2):
            witness = overlap(first, second, records)
            if witness is not None:
                shown = ", ".join(f"{d} {v}" for d, v in witness.items())
                problems.append(Disagreement(None, f"{patch_id}: variants {first.name!r} and {second.name!r} overlap "
                                             f"(both select {shown})"))
    for patch_id, variants in matrix.patches.items():
        known = registered.get(patch_id)
        if known is None:
            example = next((r for rs in variants.values() for r in rs), None)
            problems.append(Disagreement(example.position if example else where,
                                         f"{patch_id}: in the matrix but no such patch is registered "
                                         f"(known: {', '.join(sorted(registered)) or 'none'})"))
            continue
        for variant_name, found in variants.items():
            declared = next((v for v in known.variants if v.name == variant_name), None)
            if declared is None:
                position = found[0].position if found else where
                problems.append(Disagreement(position, f"{patch_id}: the matrix has variant {variant_name!r}, "
                                             f"the patch declares {', '.join(repr(v.name) for v in known.variants)}"))
                continue
            problems += _check_records(matrix, patch_id, declared, found)
    return problems


def _check_records(matrix: Matrix, patch_id: str, variant: Variant,
                   records: Sequence[VersionRecord]) -> list[Disagreement]:
    problems = []
    declared = {str(target) for action in variant.installs for target in action.targets}
    for record in records:
        shown = ", ".join(f"{d} {v}" for d, v in sorted(record.versions.items()))
        inside = covers(variant, record.versions)
        if record.status in IN_RANGE and not inside:
            problems.append(Disagreement(record.position, f"{patch_id}: variant {variant.name!r} does not cover "
                                         f"{shown}, recorded as {record.status}"))
        if record.status not in IN_RANGE and inside:
            problems.append(Disagreement(record.position, f"{patch_id}: variant {variant.name!r} covers {shown}, "
                                         f"recorded as {record.status}; narrow the range"))
        for target in record.targets:
            if target not in declared:
                problems.append(Disagreement(record.position, f"{patch_id}: {target} is recorded but variant "
                                             f"{variant.name!r} does not patch it"))
        for source in record.verified_by:
            env = source.partition(":")[2]
            if source.startswith("tests:") and env not in matrix.environments:
                problems.append(Disagreement(record.position, f"{patch_id}: verified_by names environment {env!r}, "
                                             f"which the matrix does not define"))
    return problems
