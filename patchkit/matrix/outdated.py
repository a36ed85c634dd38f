"""``patchkit matrix outdated``: upstream releases newer than the matrix covers, and what each means.

For every upstream a patch targets, the index's releases newer than the newest version the matrix
records are listed (pre-releases flagged), and each is checked statically from its artifact: for every
patch on that upstream, the variant whose range holds the release (or, past every range, the nearest
variant: the one recorded on the newest version) has each target looked up and fingerprinted:

- ``ok``: in a variant's range and every target equals a fingerprint recorded for that variant, or the
  variant is native;
- ``code_identical``: past every range, but every target equals a recorded fingerprint: the engine
  applies it there with reason ``code_identical``; a release of patchkit should still widen the range;
- ``attention``: a target is missing or its code changed: run the tests on that release, then widen
  the range, add a variant or declare it native.

Exit status 1 when anything needs attention, so a scheduled workflow turns red.
"""

from __future__ import annotations

import json
import logging
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ..runtime.catalogue import Registered
from ..runtime.declaration import Replace, Target, Variant, Wrap
from .artifacts import DEFAULT_CACHE, ArtifactSpec, SourceTree, fetch
from .model import Matrix
from .symbols import ABSENT, inspect_target

logger = logging.getLogger(__name__)

DEFAULT_JSON_API = "https://pypi.org/pypi/{distribution}/json"
OK = "ok"
CODE_IDENTICAL = "code_identical"
ATTENTION = "attention"


@dataclass(frozen=True)
class Assessment:
    """One patch on one release that the matrix does not cover yet."""

    patch_id: str
    distribution: str
    version: str
    prerelease: bool
    verdict: str
    variant: str | None
    detail: str

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def index_releases(distribution: str, api: str = DEFAULT_JSON_API) -> list[str]:
    """Every non-yanked release of ``distribution`` on the index (PyPI's JSON API), oldest first."""
    with urllib.request.urlopen(api.format(distribution=distribution), timeout=60) as response:
        data = json.load(response)
    found = []
    for text, files in data.get("releases", {}).items():
        if not files or all(f.get("yanked") for f in files):
            continue
        try:
            found.append(Version(text))
        except InvalidVersion:
            logger.debug("patchkit: %s %s is not a PEP 440 version; ignored", distribution, text)
    return [str(v) for v in sorted(found)]


def newest_recorded(matrix: Matrix, distribution: str) -> Version | None:
    """The newest version of ``distribution`` any record of the matrix names."""
    versions = [Version(record.versions[distribution])
                for variants in matrix.patches.values() for records in variants.values()
                for record in records if distribution in record.versions]
    return max(versions, default=None)


def _recorded(matrix: Matrix, patch_id: str, variant: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for record in matrix.records(patch_id, variant):
        for target, facts in record.targets.items():
            if facts.fingerprint:
                found.setdefault(target, set()).add(facts.fingerprint)
    return found


def _holds(variant: Variant, distribution: str, version: str) -> bool:
    return SpecifierSet(variant.requires[distribution]).contains(version, prereleases=True)


def _nearest(matrix: Matrix, patch_id: str, variants: Sequence[Variant], distribution: str) -> Variant | None:
    """The variant recorded on the newest release of ``distribution``: what a newer release most resembles."""
    def newest(variant: Variant) -> Version:
        versions = [Version(r.versions[distribution]) for r in matrix.records(patch_id, variant.name)
                    if distribution in r.versions]
        return max(versions, default=Version("0"))

    return max(variants, key=newest, default=None)


def assess(registered: Registered, matrix: Matrix, distribution: str, version: str,
           tree: SourceTree) -> Assessment | None:
    """What release ``version`` of ``distribution`` means for one patch (None: the patch does not target it)."""
    patch = registered.patch
    variants = [v for v in patch.variants if distribution in v.requires]
    if not variants:
        return None
    prerelease = Version(version).is_prerelease
    in_range = next((v for v in variants if _holds(v, distribution, version)), None)
    variant = in_range or _nearest(matrix, patch.id, [v for v in variants if v.native is None], distribution)
    if variant is None:
        return Assessment(patch.id, distribution, version, prerelease, ATTENTION, None,
                          "past every range, and no installing variant to compare with")
    if variant.native is not None:
        return Assessment(patch.id, distribution, version, prerelease, OK, variant.name, "native in this range")
    recorded = _recorded(matrix, patch.id, variant.name)
    problems = []
    for action in variant.installs:
        if not isinstance(action, (Replace, Wrap)):
            continue
        facts = inspect_target(tree.module_file, Target.parse(action.target))
        if facts.status == ABSENT:
            problems.append(f"{action.target} is absent")
        elif facts.fingerprint not in recorded.get(action.target, set()):
            problems.append(f"{action.target} changed (fingerprint {facts.fingerprint})")
    where = "in range" if in_range is not None else "past every range"
    if problems:
        return Assessment(patch.id, distribution, version, prerelease, ATTENTION, variant.name,
                          f"{where} of variant {variant.name}: {'; '.join(problems)}")
    verdict = OK if in_range is not None else CODE_IDENTICAL
    return Assessment(patch.id, distribution, version, prerelease, verdict, variant.name,
                      f"{where} of variant {variant.name}: every target identical to a recorded fingerprint")


def outdated(matrix: Matrix, patches: Sequence[Registered], distributions: Iterable[str] = (),
             releases: Callable[[str], list[str]] = index_releases,
             tree_of: Callable[[str, str], SourceTree] | None = None,
             cache: Path = DEFAULT_CACHE) -> list[Assessment]:
    """Every patch's assessment on every release newer than the matrix covers."""
    tree_of = tree_of or (lambda dist, version: fetch(ArtifactSpec(dist), version, cache))
    wanted = list(distributions) or sorted({d for r in patches for d in r.patch.distributions})
    found: list[Assessment] = []
    for distribution in wanted:
        newest = newest_recorded(matrix, distribution)
        newer = [v for v in releases(distribution) if newest is None or Version(v) > newest]
        for version in newer:
            tree = tree_of(distribution, version)
            found += [a for r in patches if (a := assess(r, matrix, distribution, version, tree)) is not None]
    return found


def render(assessments: Sequence[Assessment], covered: Mapping[str, Version | None]) -> str:
    lines = [f"{dist}: newest recorded {version or 'none'}" for dist, version in covered.items()]
    for a in assessments:
        flag = " (pre-release)" if a.prerelease else ""
        lines.append(f"{a.verdict:<14} {a.distribution} {a.version}{flag} {a.patch_id}: {a.detail}")
    attention = sum(a.verdict == ATTENTION for a in assessments)
    lines.append(f"{len(assessments)} patch/release pairs, {attention} need attention")
    return "\n".join(lines)
