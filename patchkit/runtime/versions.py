"""Which upstream versions are installed, and which variant of a patch they select.

Resolution is lazy about cost: a distribution whose import package cannot be found is "not
installed" without reading any metadata. Versions are found by :mod:`.installed` (from the
distribution's metadata through :mod:`.distinfo`: ``importlib.metadata``'s answer without its import
cost) and are compared with :mod:`.pep440` (``packaging``'s rules without its import cost).

Pre-releases: a specifier is evaluated with pre-releases allowed, and PEP 440's bound rules decide
the rest: ``0.48.0rc1`` is outside both ``<0.48`` and ``>=0.48``. Ranges that should hold a
version's pre-releases say so with ``rc0`` bounds (``>=0.48.0rc0,<0.49.0rc0``); a pre-release no
range holds is "beyond the range" like any newer release, and code identity can still apply it.
"""

from __future__ import annotations

from enum import Enum

from . import installed, pep440
from .errors import DeclarationError
from .pep440 import SpecifierSet, Version
from .records import Record

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:  # declarations are made when a patch needs one, not at start-up
    from typing import Any, Mapping

    from .declaration import Patch, Variant


class Availability(Enum):
    INSTALLED = installed.INSTALLED
    MISSING = installed.MISSING
    #: Installed without metadata and not imported yet: its ``__version__`` is read on import.
    DEFERRED = installed.DEFERRED


class InstalledVersion(Record):
    availability: Availability
    version: "Version | None" = None
    raw: str | None = None
    #: The module whose import resolves a DEFERRED version.
    module: str | None = None


def _parse(raw: str) -> "Version | None":
    try:
        return pep440.parse(raw)
    except pep440.InvalidVersion:
        return None


def installed_version(distribution: str, module: str | None = None) -> InstalledVersion:
    """Find the installed version of ``distribution`` (see :func:`.installed.find`), parsed."""
    availability, raw = installed.find(distribution, module)
    return from_found(availability, raw, module)


def from_found(availability: str, raw: str | None, module: str | None) -> InstalledVersion:
    """The :class:`InstalledVersion` of what :func:`.installed.find` answered."""
    if availability == installed.INSTALLED:
        assert raw is not None
        return InstalledVersion(Availability.INSTALLED, _parse(raw), raw)
    if availability == installed.DEFERRED:
        return InstalledVersion(Availability.DEFERRED, module=module)
    return InstalledVersion(Availability.MISSING)


#: Parsed specifier sets, and which versions they hold: a catalogue repeats the same few ranges in
#: many patches, and each decision asks again (start-up must not grow with the number of patches).
_SPECIFIERS: dict[str, SpecifierSet] = {}
_CONTAINS: dict[tuple[str, Version], bool] = {}


def specifier(spec: str) -> SpecifierSet:
    found = _SPECIFIERS.get(spec)
    if found is None:
        try:
            found = _SPECIFIERS[spec] = SpecifierSet(spec)
        except (pep440.InvalidSpecifier, pep440.InvalidVersion) as exc:
            raise DeclarationError(f"invalid version specifier {spec!r}: {exc}") from None
    return found


def variant_matches(variant: Variant, versions: Mapping[str, InstalledVersion]) -> bool:
    """Every requirement holds. Pre-releases, dev and local versions count as their release."""
    for dist, spec in variant.requires.items():
        found = versions.get(dist)
        if found is None or found.version is None:
            return False
        key = (spec, found.version)
        holds = _CONTAINS.get(key)
        if holds is None:
            holds = _CONTAINS[key] = specifier(spec).contains(found.version)
        if not holds:
            return False
    return True


class Outcome(Enum):
    SELECTED = "selected"
    NOT_INSTALLED = "not_installed"
    DEFERRED = "deferred"
    UNSUPPORTED = "unsupported"


class Selection(Record):
    outcome: Outcome
    variant: Variant | None = None
    #: For UNSUPPORTED: the variant nearest the installed versions, which PATCHKIT_FORCE applies.
    nearest: Variant | None = None
    waiting_for: tuple[str, ...] = ()
    detail: str = ""


def select_variant(patch: Patch, versions: Mapping[str, InstalledVersion]) -> Selection:
    """Pick the one variant whose requirements hold for the installed versions."""
    candidates = [v for v in patch.variants if all(_present(versions.get(d)) for d in v.requires)]
    if not candidates:
        missing = sorted({d for v in patch.variants for d in v.requires if not _present(versions.get(d))})
        waiting = sorted({found.module for d in missing if (found := versions.get(d)) is not None
                          and found.availability is Availability.DEFERRED and found.module})
        if len(waiting) == len(missing):  # every missing version is only waiting for an import
            return Selection(Outcome.DEFERRED, waiting_for=tuple(waiting),
                             detail=f"version of {', '.join(missing)} known once {', '.join(waiting)} is imported")
        return Selection(Outcome.NOT_INSTALLED, detail=f"{', '.join(missing)} not installed")
    matching = [v for v in candidates if variant_matches(v, versions)]
    if len(matching) > 1:
        raise DeclarationError(f"{patch.id}: variants {[v.name for v in matching]} overlap")
    if matching:
        return Selection(Outcome.SELECTED, variant=matching[0])
    installed = ", ".join(f"{d} {versions[d].raw}" for d in patch.distributions if _present(versions.get(d)))
    ranges = "; ".join(v.name for v in patch.variants)
    return Selection(Outcome.UNSUPPORTED, nearest=_nearest(candidates, versions),
                     detail=f"installed {installed} is outside the verified ranges ({ranges})")


def _present(found: InstalledVersion | None) -> bool:
    return found is not None and found.availability is Availability.INSTALLED


def _lower_bound(spec: str) -> tuple[Any, ...]:
    bounds = [v.key() for op, v in specifier(spec).bounds() if op in (">=", ">", "==", "~=")]
    return max(bounds) if bounds else pep440.parse("0").key()


def _nearest(candidates: list[Variant], versions: Mapping[str, InstalledVersion]) -> Variant | None:
    """The variant with the highest lower bound not above the installed version, else the lowest.

    Judged on each variant's first required distribution, the one the patch is about.
    """
    def key(variant: Variant) -> tuple[Any, ...]:
        dist, spec = next(iter(variant.requires.items()))
        return _lower_bound(spec)

    ordered = sorted(candidates, key=key)
    if not ordered:
        return None
    dist = next(iter(ordered[0].requires))
    installed = versions[dist].version
    below = [v for v in ordered if installed is not None and key(v) <= installed.key()]
    return below[-1] if below else ordered[0]


def beyond_every_range(patch: Patch, versions: Mapping[str, InstalledVersion]) -> bool:
    """Whether the installed version of the patch's main distribution is above every variant's range.

    Code identity (:mod:`.drift`) only ever applies a variant to a *newer* release: one between two
    ranges, or below the first, is a gap in what was verified, not a release patchkit has not seen.
    """
    dist = patch.distributions[0] if patch.distributions else None
    installed = versions.get(dist) if dist else None
    if installed is None or installed.version is None:
        return False
    ranges = [specifier(spec) for v in patch.variants for d, spec in v.requires.items() if d == dist]
    return bool(ranges) and all(r.above(installed.version) for r in ranges)
