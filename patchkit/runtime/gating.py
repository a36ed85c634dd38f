"""What happens to a patch whose installed upstream is outside every verified range, or forced.

Two rules on top of plain version gating (:mod:`.versions`), kept here so the engine only asks:

* **Code identity.** A release beyond every variant's range (a new upstream release patchkit has not
  been tested on) gets the nearest variant if every one of that variant's fingerprinted targets has
  code equal to a fingerprint recorded for it (:func:`patchkit.runtime.drift.identity`): the patch
  applies with reason ``code_identical``. Any target that differs, has no record, or cannot be read
  keeps it skipped (``unsupported_version``), and the detail names that target. Versions *between*
  or *below* ranges are gaps in what was verified, not new releases, and stay version-gated.
* **Force never doubles upstream.** ``PATCHKIT_FORCE`` applies the nearest variant outside the
  verified range, unless upstream has the behaviour natively there: the variant that would be used
  is ``native``, or a ``native`` variant's range starts at or below the installed version. Then
  :class:`~patchkit.runtime.errors.ForceRefusedError` (strict) or a ``native`` skip with that error
  recorded (otherwise): installing it would apply the behaviour twice.
"""

from __future__ import annotations

from .versions import Outcome, beyond_every_range, specifier

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Mapping

    from .declaration import Patch, Variant  # types only: declarations are made when a patch needs one
    from .drift import Identity, RecordSource
    from .versions import InstalledVersion, Selection


def native_refusal(patch: Patch, versions: Mapping[str, InstalledVersion], selection: Selection) -> Variant | None:
    """The native variant that makes forcing ``patch`` wrong on the installed versions, or None."""
    chosen = selection.variant if selection.outcome is Outcome.SELECTED else selection.nearest
    if chosen is not None and chosen.native is not None:
        return chosen
    if selection.outcome is not Outcome.UNSUPPORTED:
        return None
    for variant in patch.variants:
        if variant.native is None:
            continue
        started = True
        for dist, spec in variant.requires.items():
            found = versions.get(dist)
            if found is None or found.version is None:
                started = False
                break
            lower = [(op, v) for op, v in specifier(spec).bounds() if op in (">=", ">")]
            if not all(specifier(f"{op}{v}").contains(found.version) for op, v in lower):
                started = False
                break
        if started:
            return variant
    return None


def identity_applies(patch: Patch, versions: Mapping[str, InstalledVersion], selection: Selection) -> bool:
    """Whether code identity decides an UNSUPPORTED selection: the release is beyond every range and
    the nearest variant installs something (a native one has no code to compare)."""
    nearest = selection.nearest
    return (selection.outcome is Outcome.UNSUPPORTED and nearest is not None and nearest.native is None
            and beyond_every_range(patch, versions))


def identity_blocker(patch: Patch, variant: Variant, source: "RecordSource", strict: bool) -> str | None:
    """Why code identity cannot hold, known before any upstream module is imported (no records)."""
    from .drift import identity_blocker as blocker

    return blocker(patch.id, variant, source, strict)


def identity(patch: Patch, variant: Variant, source: "RecordSource", strict: bool) -> "Identity":
    """Compare ``variant``'s targets, which must be imported by now, with their records."""
    from .drift import identity as compare

    return compare(patch.id, variant, source, strict)
