"""What the catalogue's index alone settles about a patch, before its declaration is read.

A patch read from the index is switched off (``PATCHKIT_ENABLE``/``DISABLE``, opt-in), or its
upstream is not installed (skipped), or its upstream is installed and none of the modules its
variants install into is imported yet (pending, *undecided*: its variant is chosen when one of them
is imported). Anything else needs the whole decision (:mod:`.decision`). The engine asks here first
for every patch of the index (:meth:`.engine.Engine._consider`), and so does the start-up pass of a
process that has no engine yet (:mod:`.process_engine`): the same answers, from one place.

What is settled is said as the :class:`.status.PatchStatus` the patch then has. Nothing here reads
a declaration, parses a version or imports an upstream: this is what keeps start-up flat in the size
of the catalogue.
"""

from __future__ import annotations

from types import MappingProxyType

from .installed import MISSING
from .records import Record
from .settings import OPT_IN
from .status import PatchStatus, Reason, State

TYPE_CHECKING = False  # `typing` is not imported at start-up
if TYPE_CHECKING:
    from typing import Callable, Mapping

    from .settings import Settings

    #: (distribution, its import package or None) -> what :func:`.installed.find` answers.
    Finder = Callable[[str, "str | None"], tuple[str, "str | None"]]


class Upstream(Record):
    """What the index settles alike for every patch that declares the same distributions: made once
    per pass and shared by those patches' statuses (hence read-only). Start-up keeps nothing else per
    patch but its status: every object a process keeps counts towards the garbage collector's next
    collection, and a catalogue of many patches would otherwise set one off at every start."""

    #: Each distribution's version as its metadata spells it (None: not installed).
    versions: Mapping[str, str | None]
    #: Why its patches are skipped (``"a, b not installed"``), or ``""``: every distribution is installed.
    missing: str
    #: Its distributions' import packages: what a patch that names no module waits for.
    packages: tuple[str, ...]


def switched_off(patch_id: str, opt_in: bool, settings: Settings) -> tuple[Reason, str] | None:
    """The reason and detail of a patch that ``settings`` switch off (needs no fact), or None."""
    if not settings.is_enabled(patch_id, opt_in):
        if opt_in:
            return Reason.OPT_IN, f"opt-in: enable with {OPT_IN}={patch_id}"
        return Reason.DISABLED, "not in PATCHKIT_ENABLE"
    if settings.is_disabled(patch_id):
        return Reason.DISABLED, "disabled by PATCHKIT_DISABLE"
    return None


def upstream(distributions: tuple[tuple[str, str | None], ...], required: tuple[str, ...],
             find: Finder) -> Upstream | None:
    """Settle a patch's upstream from its index record (its distributions with their import packages,
    and those every variant requires: :func:`.catalogue.indexed_summary`), or None if only the decision
    can: a version known only once the upstream is imported, or an upstream installed in part that some
    variant may do without. A distribution every variant requires missing, or all of them: not
    installed. Versions are not parsed here: one that does not parse is reported by the decision once
    the upstream is imported, like a version outside every range.
    ``find`` is :func:`.installed.find` (or a cache of it).
    """
    versions: dict[str, str | None] = {}
    absent: list[str] = []
    for dist, module in distributions:
        availability, raw = find(dist, module)
        if availability == MISSING:
            absent.append(dist)
            continue
        if raw is None:
            return None  # deferred: the version is read once the module is imported
        versions[dist] = raw
    packages = tuple(module for _, module in distributions if module is not None)
    if not absent:
        return Upstream(MappingProxyType(versions), "", packages)
    if not any(dist in required for dist in absent) and len(absent) < len(distributions):
        return None  # installed in part, and some variant may not need what is missing: for the decision
    return Upstream(MappingProxyType({dist: versions.get(dist) for dist, _ in distributions}),
                    f"{', '.join(sorted(absent))} not installed", packages)


def from_index(patch_id: str, settled: Upstream, modules: tuple[str, ...],
               imported: Callable[[str], bool]) -> PatchStatus | None:
    """The status of a patch whose upstream is ``settled``, or None if it needs the whole decision.

    Its upstream not installed: skipped. Installed, none of ``modules`` (those whose import decides it)
    imported yet: pending, undecided, until one is. A patch whose every variant is native installs into
    no module: it waits for its upstream's import package instead. Anything else (a target module
    imported, no module to wait for) is for the decision. ``imported`` says whether a module has
    finished importing.
    """
    if settled.missing:
        return PatchStatus(patch_id, State.SKIPPED, Reason.NOT_INSTALLED, settled.missing, None, settled.versions)
    waiting = modules or settled.packages
    if not waiting:
        return None  # nothing to wait for: decided now
    for module in waiting:
        if imported(module):
            return None  # a module is here: decided now
    return PatchStatus(patch_id, State.PENDING, None,
                       f"waiting for {' or '.join(waiting)} to be imported; its variant is chosen then", None,
                       settled.versions, None, (), waiting)
