"""Drift: upstream changed the code a patch replaces, compared with what the matrix recorded.

When a variant is about to install, each of its ``Replace``/``Wrap`` targets is fingerprinted
(:mod:`patchkit.runtime.fingerprint`) and compared with the fingerprints ``compat_matrix.yaml`` recorded
for that variant on the versions in its range. A target matching none of them is drifted: the
patch was verified against other code than what is installed now. A target with no recorded
fingerprint, or without readable source, is unknown, never drifted.

This module, the matrix and the fingerprints are loaded only here, when something installs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Union

from .declaration import Replace, Target, Variant, Wrap
from .errors import PatchkitError

logger = logging.getLogger(__name__)

if TYPE_CHECKING:  # the matrix package is imported only when something installs
    from ..matrix.model import Matrix

#: Where the engine reads fingerprints from: a path to a matrix file, a loaded matrix, or None for
#: the matrix shipped with patchkit.
MatrixSource = Union[str, "os.PathLike[str]", "Matrix", None]


@dataclass(frozen=True)
class Drift:
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


def _matrix(source: MatrixSource, strict: bool) -> "Matrix | None":
    from ..matrix import loader
    from ..matrix.model import Matrix

    if isinstance(source, Matrix):
        return source
    try:
        return loader.load(source)
    except FileNotFoundError:
        logger.debug("patchkit: no compatibility matrix; drift is not checked")
        return None
    except PatchkitError:
        if strict:
            raise
        logger.error("patchkit: the compatibility matrix is malformed; drift is not checked", exc_info=True)
        return None


def _installed_versions(variant: Variant) -> dict[str, str]:
    """The installed version of each distribution the variant requires, as metadata spells it."""
    from importlib import metadata

    found = {}
    for dist in variant.requires:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def _in_range(variant: Variant, versions: Mapping[str, str]) -> bool:
    from packaging.version import InvalidVersion, Version

    from .versions import specifier

    for dist, spec in variant.requires.items():
        try:
            if dist not in versions or not specifier(spec).contains(Version(versions[dist]), prereleases=True):
                return False
        except InvalidVersion:
            return False
    return True


def check(patch_id: str, variant: Variant, source: MatrixSource = None, strict: bool = False) -> Drift | None:
    """Compare ``variant``'s targets, as installed now, with the matrix. None: not drifted or unknown."""
    matrix = _matrix(source, strict)
    if matrix is None:
        return None
    from ..matrix.model import VERIFIED

    every_record = matrix.records(patch_id, variant.name)
    records = [r for r in every_record if r.status == VERIFIED and r.targets and _in_range(variant, r.versions)]
    if not records:
        return None
    # The installed release itself recorded without a fingerprint (its tests ran where the target
    # could not be read): nothing to compare it with, so unknown, never drift against another release.
    installed = _installed_versions(variant)
    own_records = [r for r in every_record if dict(r.versions) == installed]
    from .fingerprint import target_fingerprint

    drifted, compared = [], []
    for action in variant.installs:
        if not isinstance(action, (Replace, Wrap)):
            continue
        recorded = {r.targets[action.target].fingerprint: r for r in records
                    if action.target in r.targets and r.targets[action.target].fingerprint}
        if not recorded:
            continue
        if own_records and not any(action.target in r.targets and r.targets[action.target].fingerprint
                                   for r in own_records):
            continue
        current = target_fingerprint(Target.parse(action.target))
        if current is None or current in recorded:
            continue
        drifted.append(action.target)
        for record in recorded.values():
            shown = ", ".join(f"{dist} {version}" for dist, version in sorted(record.versions.items()))
            if shown not in compared:
                compared.append(shown)
    if not drifted:
        return None
    return Drift(patch_id, variant.name, tuple(drifted), tuple(compared))
